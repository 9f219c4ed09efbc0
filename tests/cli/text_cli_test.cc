// Text in, text out through the command: `epmoe tokenize` against the fixture cases, and
// `generate --prompt/--chat` end to end on a small synthesized model that carries a tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "common/golden.h"
#include "common/run.h"

namespace epmoe {
namespace {

const std::string kTok = test::data_dir() + "/bpe-tokenizer";

TEST(TokenizeCli, TextGivesTheFixtureIds) {
  auto cases = nlohmann::json::parse(std::ifstream(kTok + "/cases.json"));
  int checked = 0;
  for (auto& c : cases) {
    const std::string text = c["text"];
    if (text.find('\'') != std::string::npos || text.find('\n') != std::string::npos) continue;  // shell quoting
    auto r = test::run_command(test::epmoe() + " tokenize --model " + kTok + " --text '" + text + "'");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, test::join(c["ids"].get<std::vector<int32_t>>()) + "\n") << text;
    checked++;
  }
  EXPECT_GT(checked, 3);
}

TEST(TokenizeCli, JsonlGivesOneArrayPerLine) {
  auto cases = nlohmann::json::parse(std::ifstream(kTok + "/cases.json"));
  const std::string in = ::testing::TempDir() + "/tok_cases.jsonl";
  {
    std::ofstream f(in);
    for (auto& c : cases) f << c["text"].dump() << "\n";
  }
  auto r = test::run_command(test::epmoe() + " tokenize --model " + kTok + " --jsonl " + in);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(r.output);
  std::string line;
  size_t i = 0;
  while (std::getline(lines, line)) {
    ASSERT_LT(i, cases.size());
    EXPECT_EQ(nlohmann::json::parse(line), cases[i]["ids"]) << cases[i]["text"];
    i++;
  }
  EXPECT_EQ(i, cases.size());
}

TEST(TokenizeCli, BadJsonlLineIsBadInput) {
  const std::string in = ::testing::TempDir() + "/tok_bad.jsonl";
  std::ofstream(in) << "\"fine\"\n{not json\n";
  auto r = test::run_command(test::epmoe() + " tokenize --model " + kTok + " --jsonl " + in);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(in + ":2"), std::string::npos) << r.output;
}

// A tiny random Qwen3-MoE with the fixture tokenizer's 3000-token vocabulary, made once. The
// tests that use it run as processes of their own, often at once (ctest -j): each builds into a
// folder of its own and renames it into place, so no test reads a model another is still writing
// (the folder is there only once its tokenizer is in it).
std::string text_model() {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/text_model";
  if (fs::exists(dir + "/tokenizer.json")) return dir;
  auto cfg = nlohmann::json::parse(std::ifstream(test::fixture("qwen3moe-tiny") + "/config.json"));
  cfg["vocab_size"] = 3000;
  cfg["eos_token_id"] = 2;  // <|im_end|> in the fixture tokenizer
  const std::string mine = dir + ".tmp" + std::to_string(getpid()), cfg_path = mine + ".config.json";
  std::ofstream(cfg_path) << cfg.dump();
  auto r = test::run_command(test::epmoe() + " synth --like " + cfg_path + " --dtype f32 --out " + mine);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  fs::copy_file(kTok + "/tokenizer.json", mine + "/tokenizer.json", fs::copy_options::overwrite_existing);
  std::error_code ec;
  fs::rename(mine, dir, ec);  // (fails where another test's is there already: theirs is the same)
  fs::remove_all(mine, ec);
  fs::remove(cfg_path, ec);
  return dir;
}

TEST(GenerateCli, PromptTextStreamsTextAndMatchesTheIdsPath) {
  const std::string m = text_model();
  auto ids = test::run_command(test::epmoe() + " tokenize --model " + m + " --text 'Hello, world!'");
  ASSERT_EQ(ids.exit_code, 0) << ids.output;
  const std::string id_list = ids.output.substr(0, ids.output.find('\n'));
  auto by_ids = test::run_command(test::epmoe() + " generate --ignore-eos --max-new-tokens 6 --model " + m +
                                  " --prompt-ids " + id_list);
  ASSERT_EQ(by_ids.exit_code, 0) << by_ids.output;
  auto decoded = test::run_command(test::epmoe() + " tokenize --decode --model " + m + " --text " +
                                   by_ids.output.substr(0, by_ids.output.find('\n')));
  auto by_text = test::run_command(test::epmoe() + " generate --ignore-eos --max-new-tokens 6 --model " + m +
                                   " --prompt 'Hello, world!'");
  ASSERT_EQ(by_text.exit_code, 0) << by_text.output;
  // The text path prints exactly the decoding of the ids the id path generates.
  EXPECT_EQ(by_text.output, decoded.output);
}

TEST(GenerateCli, ChatWrapsThePromptInChatML) {
  const std::string m = text_model();
  auto r = test::run_command(test::epmoe() + " generate --max-new-tokens 4 --model " + m +
                             " --chat --system 'Be brief.' --prompt 'Hi'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto no_tok = test::run_command(test::epmoe() + " generate --model " + test::fixture("qwen3moe-tiny") + " --prompt 'Hi'");
  EXPECT_EQ(no_tok.exit_code, 2) << no_tok.output;  // no tokenizer files: a clear input error
  EXPECT_NE(no_tok.output.find("qwen3moe-tiny"), std::string::npos) << no_tok.output;
}

TEST(GenerateCli, PromptsFileMixesTextAndIdLinesAndJsonAddsText) {
  const std::string m = text_model();
  auto ids = test::run_command(test::epmoe() + " tokenize --model " + m + " --text 'Hello, world!'");
  ASSERT_EQ(ids.exit_code, 0) << ids.output;
  const std::string id_list = ids.output.substr(0, ids.output.find('\n'));
  const std::string file = ::testing::TempDir() + "/text_prompts.txt";
  std::ofstream(file) << "Hello, world!\n" << id_list << "\n\"Hello, world!\"\n\"two\\nlines\"\n";
  auto r = test::run_command(test::epmoe() + " generate --ignore-eos --max-new-tokens 5 --json --model " + m +
                             " --prompts-file " + file);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> lines;
  std::istringstream in(r.output);
  for (std::string l; std::getline(in, l);)
    if (!l.empty() && l[0] == '{') lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 4u);
  // The text line, the same prompt as ids, and as a JSON string: one prompt, one output.
  EXPECT_EQ(lines[0]["prompt_ids"], lines[1]["prompt_ids"]);
  EXPECT_EQ(lines[0]["output_ids"], lines[1]["output_ids"]);
  EXPECT_EQ(lines[0]["output_ids"], lines[2]["output_ids"]);
  EXPECT_TRUE(lines[0].contains("text"));
  EXPECT_FALSE(lines[1].contains("text")) << "an ids prompt prints ids";
  auto decoded = test::run_command(test::epmoe() + " tokenize --decode --model " + m + " --text " +
                                   test::join(lines[0]["output_ids"].get<std::vector<int32_t>>()));
  EXPECT_EQ(lines[0]["text"].get<std::string>() + "\n", decoded.output);
  const std::string jsonl = ::testing::TempDir() + "/text_prompts.jsonl";
  std::ofstream(jsonl) << "\"two\\nlines\"\n";
  auto nl = test::run_command(test::epmoe() + " tokenize --model " + m + " --jsonl " + jsonl);
  EXPECT_EQ(nlohmann::json::parse(nl.output), lines[3]["prompt_ids"])
      << "a JSON-string line is decoded (its \\n is a newline)";
  // Text lines without tokenizer files: a clear input error naming the line.
  std::ofstream(file) << "1,2,3\nsome text\n";
  auto no_tok = test::run_command(test::epmoe() + " generate --model " + test::fixture("qwen3moe-tiny") +
                                  " --prompts-file " + file);
  EXPECT_EQ(no_tok.exit_code, 2) << no_tok.output;
  EXPECT_NE(no_tok.output.find(file + ":2"), std::string::npos) << no_tok.output;
}

}  // namespace
}  // namespace epmoe
