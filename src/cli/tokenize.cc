// `epmoe tokenize --model DIR --text "..."` prints the ids comma-separated;
// `epmoe tokenize --model DIR --jsonl FILE` reads one JSON string per line and prints one JSON
// array of ids per line (the shape other tools read back easily).
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace epmoe {

int run_tokenize(const TokenizeOptions& o) {
  if (o.text_given == !o.jsonl.empty()) throw InputError("tokenize: give exactly one of --text, --jsonl");
  Tokenizer tok = Tokenizer::load(o.model_dir);
  if (o.text_given) {
    if (o.decode) {
      std::printf("%s\n", tok.decode(parse_ids(o.text, "--text")).c_str());
    } else {
      std::printf("%s\n", join_ids(tok.encode(o.text)).c_str());
    }
    return 0;
  }
  std::ifstream f(o.jsonl);
  if (!f) throw InputError(o.jsonl + ": cannot open");
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    n++;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(o.jsonl + ":" + std::to_string(n) + ": invalid JSON: " + e.what());
    }
    if (!j.is_string()) throw InputError(o.jsonl + ":" + std::to_string(n) + ": expected a JSON string");
    std::printf("%s\n", nlohmann::json(tok.encode(j.get<std::string>())).dump().c_str());
  }
  return 0;
}

}  // namespace epmoe
