// Reading a tokenizer description from the Hugging Face files of a model folder.
//
// Two layouts: tokenizer.json (everything in one file, what transformers writes today), and
// the older vocab.json + merges.txt + tokenizer_config.json of Qwen2Tokenizer. Both are read
// into a TokenizerSpec. Anything malformed, or a feature we do not implement (and so could not
// reproduce exactly), is an InputError naming the file and the field.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"

namespace epmoe {

struct TokenizerSpec {
  std::string source;  // the file(s) it was read from
  Vocab vocab;
  std::vector<MergeRule> merges;  // in rank order
  bool ignore_merges = false;
  bool nfc = false;  // NFC normaliser
  PreTokenizer pre_tokenizer;
  std::vector<AddedToken> added_tokens;
};

TokenizerSpec read_tokenizer_json(const std::string& path);

TokenizerSpec read_vocab_merges(const std::string& vocab_json, const std::string& merges_txt,
                                const std::string& tokenizer_config_json);

}  // namespace epmoe
