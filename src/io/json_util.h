// Small helpers around nlohmann::json used by every parser of user files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace epmoe {

// Parses JSON text; on failure throws InputError "<file>: invalid JSON: ...".
nlohmann::json parse_json_text(const std::string& file, const std::string& text);
// Reads and parses a JSON file.
nlohmann::json read_json_file(const std::string& path);
// First top-level key that appears twice in the object `text` (nlohmann keeps only the last one
// silently), or "" when none does. `nested_key` restricts the search to the keys of that
// top-level member's object (e.g. "weight_map").
std::string find_duplicate_key(const std::string& text, const std::string& nested_key = "");

// An fp32 value for JSON as the double of its shortest decimal (at most 9 significant digits).
// nlohmann's printer may still write such a double with 17 digits (~0.15% of values): documents
// that must print every float shortest use json_fp32 and dump_json below. Non-finite: null.
nlohmann::json json_float(float v);

// A log-prob (any fp32) as a JSON number that dump_json writes as fp32_text(v): the double holds
// the float's exact value.
nlohmann::json json_fp32(float v);
// The shortest decimal that reads back (as fp32, round to nearest) as v, with ".0" added when it
// has neither a point nor an exponent (so that JSON readers see a float); "null" when not finite.
std::string fp32_text(float v);

// A JSON document as bytes: invalid UTF-8 (a token's raw bytes) becomes U+FFFD; a number that is
// exactly an fp32 is written as fp32_text (std::to_chars: nlohmann's own printer, Grisu2, gives a
// longer decimal for ~0.2% of values), any other double as the shortest decimal of that double.
std::string dump_json(const nlohmann::json& j);

bool file_exists(const std::string& path);
std::string read_text_file(const std::string& path);  // throws InputError naming the path

}  // namespace epmoe
