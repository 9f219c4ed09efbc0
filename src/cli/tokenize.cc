// `epmoe tokenize --model DIR --text "..."` prints the ids comma-separated;
// `epmoe tokenize --model DIR --jsonl FILE` reads one JSON string per line and prints one JSON
// array of ids per line (the shape other tools read back easily).
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace epmoe {

namespace {

struct TokenizeOptions {
  std::string model_dir;
  std::string text;
  bool text_given = false;
  std::string jsonl;
  bool decode = false;
};

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

}  // namespace

Command register_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Text to token ids with the model's tokenizer (tokenizer.json or vocab.json + merges.txt)");
  auto o = std::make_shared<TokenizeOptions>();
  cmd->add_option("--model", o->model_dir, "Model folder holding the tokenizer files")->required();
  cmd->add_option("--text", o->text, "Text to encode; prints comma-separated ids")->each([o](const std::string&) {
    o->text_given = true;
  });
  cmd->add_option("--jsonl", o->jsonl, "File with one JSON string per line; prints one JSON array of ids per line");
  cmd->add_flag("--decode", o->decode, "With --text: read comma-separated ids and print their text instead");
  return {cmd, [o] { return run_tokenize(*o); }};
}

}  // namespace epmoe
