#include "tokenizer/tokenizer_files.h"

#include <cctype>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "util/error.h"

namespace epmoe {
namespace {

using nlohmann::json;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot open file");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw InputError(path + ": read error");
  return std::move(ss).str();
}

json parse_json(const std::string& path) {
  const std::string text = read_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    // Not only parse_error: a number beyond double range (1e999) is out_of_range (found by
    // fuzz/tokenizer_json_fuzz.cc; it used to escape as an internal error).
    throw InputError(path + ": invalid JSON: " + e.what());
  }
}

// Typed access to one JSON file, with messages naming the file and the field at fault.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw InputError(path_ + ": " + where + ": " + what);
  }
  const json& object(const json& j, const std::string& where) const {
    if (!j.is_object()) fail(where, "expected an object");
    return j;
  }
  const json& array(const json& j, const std::string& where) const {
    if (!j.is_array()) fail(where, "expected an array");
    return j;
  }
  const std::string& string(const json& j, const std::string& where) const {
    if (!j.is_string()) fail(where, "expected a string");
    return j.get_ref<const std::string&>();
  }
  static bool is_id(const json& j) {
    return j.is_number_integer() && j.get<int64_t>() >= 0 && j.get<int64_t>() <= INT32_MAX;
  }
  int32_t id(const json& j, const std::string& where) const {
    if (!is_id(j)) fail(where, "expected a token id (a non-negative integer)");
    return static_cast<int32_t>(j.get<int64_t>());
  }
  // An optional boolean: missing or null gives `fallback`.
  bool flag(const json& obj, const char* key, bool fallback, const std::string& where) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(where + "." + key, "expected true or false");
    return it->get<bool>();
  }
  const json& member(const json& obj, const char* key, const std::string& where) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(where, std::string("missing \"") + key + "\"");
    return *it;
  }
  std::string type_of(const json& obj, const std::string& where) const {
    return string(member(object(obj, where), "type", where), where + ".type");
  }
  [[noreturn]] void unsupported(const std::string& where, const std::string& what) const {
    fail(where, what + " is not supported (only byte-level BPE tokenizers are)");
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Vocab read_vocab(const Reader& r, const json& j, const std::string& where) {
  Vocab vocab;
  vocab.reserve(r.object(j, where).size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    // The message is only built on failure: the vocabulary has ~150k entries.
    if (!Reader::is_id(*it)) r.id(*it, where + "[\"" + it.key() + "\"]");
    vocab.emplace(it.key(), static_cast<int32_t>(it->get<int64_t>()));
  }
  return vocab;
}

// A merge written "left right" (merges.txt, older tokenizer.json files).
template <class Where>
MergeRule split_merge(const Reader& r, std::string_view line, Where where) {
  const size_t sp = line.find(' ');
  if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
      line.find(' ', sp + 1) != std::string_view::npos)
    r.fail(where(), "expected two tokens separated by one space, got '" + std::string(line) + "'");
  return {std::string(line.substr(0, sp)), std::string(line.substr(sp + 1))};
}

AddedToken read_added_token(const Reader& r, const json& j, int32_t id, const std::string& where) {
  r.object(j, where);
  AddedToken t;
  t.id = id;
  t.content = r.string(r.member(j, "content", where), where + ".content");
  t.special = r.flag(j, "special", false, where);
  // tokenizers' default: special tokens match the raw text, other added tokens the normalised.
  t.normalized = r.flag(j, "normalized", !t.special, where);
  t.lstrip = r.flag(j, "lstrip", false, where);
  t.rstrip = r.flag(j, "rstrip", false, where);
  t.single_word = r.flag(j, "single_word", false, where);
  return t;
}

void read_model(const Reader& r, const json& model, TokenizerSpec& spec) {
  const std::string where = "model";
  r.object(model, where);
  if (model.contains("type") && r.type_of(model, where) != "BPE")
    r.unsupported(where + ".type", "model type '" + r.type_of(model, where) + "'");
  if (r.flag(model, "byte_fallback", false, where)) r.unsupported(where, "byte_fallback");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && !it->is_null() &&
        !(it->is_string() && it->get_ref<const std::string&>().empty()))
      r.unsupported(where + "." + key, "a non-empty value");
  }
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    if (!it->is_number()) r.fail(where + ".dropout", "expected a number or null");
    if (it->get<double>() > 0) r.unsupported(where + ".dropout", "BPE dropout");
  }
  spec.ignore_merges = r.flag(model, "ignore_merges", false, where);
  spec.vocab = read_vocab(r, r.member(model, "vocab", where), where + ".vocab");

  const json& merges = r.array(r.member(model, "merges", where), where + ".merges");
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    auto mw = [&] { return where + ".merges[" + std::to_string(i) + "]"; };  // only on failure
    if (m.is_string()) {                                                     // "left right"
      spec.merges.push_back(split_merge(r, m.get_ref<const std::string&>(), mw));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      spec.merges.push_back({m[0].get<std::string>(), m[1].get<std::string>()});  // ["l", "r"]
    } else {
      r.fail(mw(), "expected \"left right\" or [\"left\", \"right\"]");
    }
  }
}

void read_normalizer(const Reader& r, const json& n, const std::string& where,
                     TokenizerSpec& spec) {
  if (n.is_null()) return;
  const std::string type = r.type_of(n, where);
  if (type == "NFC") {
    spec.nfc = true;
  } else if (type == "Sequence") {
    const json& list = r.array(r.member(n, "normalizers", where), where + ".normalizers");
    for (size_t i = 0; i < list.size(); ++i)
      read_normalizer(r, list[i], where + ".normalizers[" + std::to_string(i) + "]", spec);
  } else {
    r.unsupported(where, "normalizer '" + type + "'");
  }
}

void read_pre_tokenizer(const Reader& r, const json& p, const std::string& where,
                        TokenizerSpec& spec) {
  if (p.is_null()) return;
  const std::string type = r.type_of(p, where);
  if (type == "Sequence") {
    const json& list = r.array(r.member(p, "pretokenizers", where), where + ".pretokenizers");
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(r, list[i], where + ".pretokenizers[" + std::to_string(i) + "]", spec);
  } else if (type == "Split") {
    // With "Isolated" every match and every gap is kept, so `invert` makes no difference.
    const std::string behavior = r.string(r.member(p, "behavior", where), where + ".behavior");
    if (behavior != "Isolated") r.unsupported(where + ".behavior", "'" + behavior + "'");
    const json& pat = r.object(r.member(p, "pattern", where), where + ".pattern");
    const std::string source = r.path() + ": " + where + ".pattern";
    if (pat.contains("Regex")) {
      spec.pre_tokenizer.add_split(
          Regex::compile(r.string(pat["Regex"], where + ".pattern.Regex"), source));
    } else if (pat.contains("String")) {
      spec.pre_tokenizer.add_split(
          Regex::literal(r.string(pat["String"], where + ".pattern.String"), source));
    } else {
      r.fail(where + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
  } else if (type == "ByteLevel") {
    // Defaults are those of tokenizers' ByteLevel::default().
    spec.pre_tokenizer.add_byte_level(r.flag(p, "add_prefix_space", true, where),
                                      r.flag(p, "use_regex", true, where));
  } else {
    r.unsupported(where, "pre-tokenizer '" + type + "'");
  }
}

void check_decoder(const Reader& r, const json& d) {
  if (d.is_null() || r.type_of(d, "decoder") != "ByteLevel")
    r.unsupported("decoder", d.is_null() ? std::string("no decoder")
                                         : "decoder '" + r.type_of(d, "decoder") + "'");
}

// Post-processors that add tokens (a BOS, say) would change encode()'s output; only those that
// add nothing are accepted.
void check_post_processor(const Reader& r, const json& p, const std::string& where) {
  if (p.is_null()) return;
  const std::string type = r.type_of(p, where);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    const json& list = r.array(r.member(p, "processors", where), where + ".processors");
    for (size_t i = 0; i < list.size(); ++i)
      check_post_processor(r, list[i], where + ".processors[" + std::to_string(i) + "]");
    return;
  }
  if (type == "TemplateProcessing") {
    const json& single = r.array(r.member(p, "single", where), where + ".single");
    for (const json& piece : single)
      if (!piece.is_object() || !piece.contains("Sequence"))
        r.unsupported(where + ".single", "a template that adds special tokens");
    return;
  }
  r.unsupported(where, "post-processor '" + type + "'");
}

}  // namespace

TokenizerSpec read_tokenizer_json(const std::string& path) {
  const Reader r(path);
  const json root = parse_json(path);
  r.object(root, "top level");
  TokenizerSpec spec;
  spec.source = path;
  read_model(r, r.member(root, "model", "top level"), spec);
  if (auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
    r.array(*it, "added_tokens");
    for (size_t i = 0; i < it->size(); ++i) {
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      const json& t = r.object((*it)[i], where);
      spec.added_tokens.push_back(
          read_added_token(r, t, r.id(r.member(t, "id", where), where + ".id"), where));
    }
  }
  read_normalizer(r, root.value("normalizer", json()), "normalizer", spec);
  read_pre_tokenizer(r, root.value("pre_tokenizer", json()), "pre_tokenizer", spec);
  check_decoder(r, root.value("decoder", json()));
  check_post_processor(r, root.value("post_processor", json()), "post_processor");
  return spec;
}

TokenizerSpec read_vocab_merges(const std::string& vocab_json, const std::string& merges_txt,
                                const std::string& tokenizer_config_json) {
  TokenizerSpec spec;
  spec.source = vocab_json + " + " + merges_txt;
  {
    const Reader r(vocab_json);
    spec.vocab = read_vocab(r, parse_json(vocab_json), "top level");
  }
  {
    // As transformers reads it: a "#version" first line and blank lines are skipped, every
    // other line is one merge; surrounding whitespace (a CR of CRLF files) is ignored.
    const Reader r(merges_txt);
    const std::string text = read_file(merges_txt);
    std::string_view rest = text;
    for (size_t line_no = 1; !rest.empty(); ++line_no) {
      const size_t nl = rest.find('\n');
      std::string_view line = rest.substr(0, nl);
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
      while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back())))
        line.remove_suffix(1);
      while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front())))
        line.remove_prefix(1);
      if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
      spec.merges.push_back(
          split_merge(r, line, [&] { return "line " + std::to_string(line_no); }));
    }
  }
  {
    const Reader r(tokenizer_config_json);
    const json config = r.object(parse_json(tokenizer_config_json), "top level");
    if (auto it = config.find("tokenizer_class"); it != config.end() && !it->is_null()) {
      const std::string cls = r.string(*it, "tokenizer_class");
      if (cls != "Qwen2Tokenizer" && cls != "Qwen2TokenizerFast")
        r.unsupported("tokenizer_class", "'" + cls + "' without a tokenizer.json");
    }
    if (auto it = config.find("added_tokens_decoder"); it != config.end() && !it->is_null()) {
      r.object(*it, "added_tokens_decoder");
      for (auto t = it->begin(); t != it->end(); ++t) {
        const std::string where = "added_tokens_decoder[\"" + t.key() + "\"]";
        int64_t id = -1;
        try {
          size_t used = 0;
          id = std::stoll(t.key(), &used);
          if (used != t.key().size()) id = -1;
        } catch (const std::exception&) {
        }
        if (id < 0 || id > INT32_MAX) r.fail(where, "the key must be a token id");
        spec.added_tokens.push_back(read_added_token(r, *t, static_cast<int32_t>(id), where));
      }
    }
    // Qwen2Tokenizer: NFC, its fixed word pattern, then bytes (a prefix space only if asked).
    spec.nfc = true;
    spec.pre_tokenizer.add_split(Regex::compile(kQwen2Pattern, "Qwen2Tokenizer pattern"));
    spec.pre_tokenizer.add_byte_level(r.flag(config, "add_prefix_space", false, "top level"),
                                      false);
  }
  return spec;
}

}  // namespace epmoe
