// The tokenizer against what Hugging Face transformers / tokenizers produced for the fixture
// strings (tests/data/tokenizers/qwen2/cases-public.json, tests/data/bpe-tokenizer/cases.json).
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "tokenizer/utf8.h"

namespace epmoe {
namespace {

using test::Case;

void expect_cases(const Tokenizer& tok, const std::vector<Case>& cases) {
  ASSERT_FALSE(cases.empty());
  for (const Case& c : cases) {
    EXPECT_EQ(tok.encode(c.text), c.ids) << "encoding '" << c.text << "'";
    EXPECT_EQ(tok.decode(c.ids), c.decoded) << "decoding the ids of '" << c.text << "'";
  }
}

const std::vector<Case>& qwen2_cases() {
  static const auto cases = test::read_cases(test::qwen2_dir() + "/cases-public.json");
  return cases;
}

const Tokenizer& qwen2() {
  static const Tokenizer tok =
      Tokenizer::from_tokenizer_json(test::qwen2_dir() + "/tokenizer.json");
  return tok;
}

TEST(Qwen2Tokenizer, TokenizerJsonMatchesTransformers) { expect_cases(qwen2(), qwen2_cases()); }

TEST(Qwen2Tokenizer, VocabMergesMatchesTransformers) {
  const std::string d = test::qwen2_dir();
  Tokenizer tok = Tokenizer::from_vocab_merges(d + "/vocab.json", d + "/merges.txt",
                                               d + "/tokenizer_config.json");
  expect_cases(tok, qwen2_cases());
}

TEST(Qwen2Tokenizer, LoadFallsBackToVocabMerges) {
  // A folder with only the older files must be found by load() on its own.
  test::ScratchDir dir;
  for (const char* name : {"vocab.json", "merges.txt", "tokenizer_config.json"}) {
    std::filesystem::copy_file(test::qwen2_dir() + "/" + name, dir.file(name));
  }
  ASSERT_TRUE(Tokenizer::available(dir.path()));
  Tokenizer tok = Tokenizer::load(dir.path());
  expect_cases(tok, qwen2_cases());
}

TEST(Qwen2Tokenizer, LoadPrefersTokenizerJson) {
  ASSERT_TRUE(Tokenizer::available(test::qwen2_dir()));
  expect_cases(Tokenizer::load(test::qwen2_dir()), qwen2_cases());
}

TEST(BpeFixture, TokenizerJsonMatchesTokenizers) {
  Tokenizer tok = Tokenizer::load(test::bpe_fixture_dir());
  expect_cases(tok, test::read_cases(test::bpe_fixture_dir() + "/cases.json"));
}

TEST(Qwen2Tokenizer, AddedTokensAndVocabSize) {
  // added_tokens.json lists the special tokens with their ids; vocab.json the model tokens.
  std::ifstream added_file(test::qwen2_dir() + "/added_tokens.json");
  std::ifstream vocab_file(test::qwen2_dir() + "/vocab.json");
  const auto added = nlohmann::json::parse(added_file);
  const auto vocab = nlohmann::json::parse(vocab_file);
  int32_t max_id = -1;
  for (const auto& [token, id] : added.items()) {
    EXPECT_EQ(qwen2().token_id(token), id.get<int32_t>()) << token;
    EXPECT_TRUE(qwen2().is_special(id.get<int32_t>())) << token;
    EXPECT_EQ(qwen2().token_bytes(id.get<int32_t>()), token);
    max_id = std::max(max_id, id.get<int32_t>());
  }
  for (const auto& [token, id] : vocab.items()) max_id = std::max(max_id, id.get<int32_t>());
  EXPECT_EQ(qwen2().vocab_size(), max_id + 1);
  EXPECT_EQ(qwen2().token_id("Ġthe"), vocab.at("Ġthe").get<int32_t>());
  EXPECT_FALSE(qwen2().token_id("no such token").has_value());
}

TEST(Qwen2Tokenizer, ChatPromptIsTheChatMLOfTransformers) {
  // The fixture holds transformers' ids for one user turn rendered by Qwen's chat template.
  const std::string user = "What is expert parallelism?";
  const Case* chat = nullptr;
  for (const Case& c : qwen2_cases())
    if (c.text.find(user) != std::string::npos) chat = &c;
  ASSERT_NE(chat, nullptr);
  EXPECT_EQ(qwen2().chat_prompt(user), chat->text);
  EXPECT_EQ(qwen2().encode(qwen2().chat_prompt(user)), chat->ids);

  const std::string with_system = qwen2().chat_prompt(user, "Be brief.");
  EXPECT_EQ(with_system, "<|im_start|>system\nBe brief.<|im_end|>\n" + chat->text);
}

TEST(Qwen2Tokenizer, DecodeSkipsSpecialTokensOnRequest) {
  for (const Case& c : qwen2_cases()) {
    std::string expected = c.decoded;
    for (const char* special : {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}) {
      for (size_t p; (p = expected.find(special)) != std::string::npos;)
        expected.erase(p, std::string(special).size());
    }
    EXPECT_EQ(qwen2().decode(c.ids, /*skip_special=*/true), expected) << c.text;
  }
}

TEST(Qwen2Tokenizer, StreamDecoderEmitsWholeCharactersOnly) {
  for (bool skip_special : {false, true}) {
    for (const Case& c : qwen2_cases()) {
      StreamDecoder stream(qwen2(), skip_special);
      std::string joined;
      for (int32_t id : c.ids) {
        const std::string piece = stream.push(id);
        EXPECT_TRUE(utf8::is_valid(piece)) << c.text;
        // Nothing is replaced for well-formed text: a piece never carries U+FFFD.
        EXPECT_EQ(piece.find(utf8::kReplacement), std::string::npos) << c.text;
        joined += piece;
      }
      joined += stream.flush();
      EXPECT_EQ(joined, qwen2().decode(c.ids, skip_special)) << c.text;
      if (!skip_special) {
        EXPECT_EQ(joined, c.decoded);
      }
    }
  }
}

TEST(Qwen2Tokenizer, DecodeSkipsIdsOutsideTheVocabulary) {
  const Case& c = qwen2_cases().front();
  std::vector<int32_t> ids = c.ids;
  ids.insert(ids.begin() + 1, {-1, qwen2().vocab_size(), qwen2().vocab_size() + 1000});
  EXPECT_EQ(qwen2().decode(ids), c.decoded);
}

}  // namespace
}  // namespace epmoe
