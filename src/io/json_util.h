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

// An fp32 value for JSON: the double of its shortest decimal that reads back as the same float
// (at most 9 significant digits), which nlohmann prints as that decimal. Non-finite values have no
// JSON number: they become null.
nlohmann::json json_float(float v);

bool file_exists(const std::string& path);
std::string read_text_file(const std::string& path);  // throws InputError naming the path

}  // namespace epmoe
