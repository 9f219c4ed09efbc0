// Malformed or missing tokenizer files are InputErrors (exit code 2) whose message names the
// file and what is wrong with it.
#include <gtest/gtest.h>

#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace epmoe {
namespace {

// A tiny but complete tokenizer.json; `model` is spliced in so tests can break it.
std::string tokenizer_json(const std::string& model) {
  return R"({"added_tokens": [], "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "decoder": {"type": "ByteLevel"}, "model": )" +
         model + "}";
}

// Runs `load` and returns the InputError's message (failing the test if there is none).
template <class F>
std::string input_error(F&& load) {
  try {
    load();
  } catch (const InputError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  ADD_FAILURE() << "no InputError";
  return "";
}

TEST(TokenizerFiles, ValidMinimalFileLoads) {
  test::ScratchDir dir;
  dir.write("tokenizer.json",
            tokenizer_json(
                R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]})"));
  Tokenizer tok = Tokenizer::load(dir.path());
  // Bytes 'a' 'b' merge; the rest of the bytes are not in this vocabulary.
  EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{2}));
  EXPECT_EQ(tok.vocab_size(), 3);
}

TEST(TokenizerFiles, MissingFilesNameTheFolder) {
  test::ScratchDir dir;
  EXPECT_FALSE(Tokenizer::available(dir.path()));
  const std::string msg = input_error([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(msg.find(dir.path()), std::string::npos) << msg;
}

TEST(TokenizerFiles, BadJsonNamesTheFile) {
  test::ScratchDir dir;
  const std::string path = dir.write("tokenizer.json", "{\"model\": {\"vocab\": ");
  const std::string msg = input_error([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("JSON"), std::string::npos) << msg;
}

TEST(TokenizerFiles, MergeWithUnknownTokenNamesFileAndToken) {
  test::ScratchDir dir;
  const std::string path = dir.write(
      "tokenizer.json",
      tokenizer_json(
          R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", "a zz"]})"));
  const std::string msg = input_error([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("'zz'"), std::string::npos) << msg;
}

TEST(TokenizerFiles, MergeWhoseResultIsMissingNamesIt) {
  test::ScratchDir dir;
  dir.write(
      "tokenizer.json",
      tokenizer_json(R"({"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "b"]]})"));
  const std::string msg = input_error([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(msg.find("'ab'"), std::string::npos) << msg;
}

TEST(TokenizerFiles, WrongFieldTypesNameTheField) {
  test::ScratchDir dir;
  const std::string path = dir.write(
      "tokenizer.json", tokenizer_json(R"({"type": "BPE", "vocab": ["a"], "merges": []})"));
  const std::string msg = input_error([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.vocab"), std::string::npos) << msg;
}

TEST(TokenizerFiles, UnsupportedModelIsRejected) {
  test::ScratchDir dir;
  dir.write("tokenizer.json", tokenizer_json(R"({"type": "Unigram", "vocab": [], "merges": []})"));
  const std::string msg = input_error([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(msg.find("Unigram"), std::string::npos) << msg;
}

TEST(TokenizerFiles, BadRegexNamesThePattern) {
  test::ScratchDir dir;
  const std::string path = dir.write("tokenizer.json", R"({"added_tokens": [],
    "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"},
    "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})");
  const std::string msg = input_error([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("(unclosed"), std::string::npos) << msg;
}

TEST(TokenizerFiles, VocabMergesErrorsNameTheFile) {
  test::ScratchDir dir;
  dir.write("vocab.json", R"({"a": 0, "b": 1, "ab": 2})");
  dir.write("tokenizer_config.json", R"({"tokenizer_class": "Qwen2Tokenizer"})");
  const std::string merges = dir.write("merges.txt", "#version: 0.2\na b\nb q\n");
  ASSERT_TRUE(Tokenizer::available(dir.path()));
  std::string msg = input_error([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(msg.find(merges), std::string::npos) << msg;
  EXPECT_NE(msg.find("'q'"), std::string::npos) << msg;

  dir.write("merges.txt", "#version: 0.2\na b c\n");
  msg = input_error([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(msg.find(merges), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;

  dir.write("merges.txt", "a b\n");
  const std::string vocab = dir.write("vocab.json", R"({"a": 0, "b": "one"})");
  msg = input_error([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(msg.find(vocab), std::string::npos) << msg;
}

}  // namespace
}  // namespace epmoe
