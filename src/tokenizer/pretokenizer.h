// Pre-tokenisation: cuts normalised text into the words that BPE encodes one at a time.
//
// Supports what byte-level BPE tokenizer.json files use: a sequence of Split steps (regex,
// "Isolated": every match and every gap between matches is a word) and a ByteLevel step
// (optional prefix space, optional GPT-2 word regex). The byte-to-character mapping itself is
// done by Bpe on the fly, so the words stay raw bytes here.
#pragma once

#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace epmoe {

class PreTokenizer {
 public:
  // Splits every word on the matches of `regex` (matches and gaps both kept, in order).
  void add_split(Regex regex);
  // ByteLevel: optionally prepends a space to words that do not start with one, and optionally
  // splits them with the GPT-2 pattern.
  void add_byte_level(bool add_prefix_space, bool use_regex);

  // Appends the words of `text` to `words`. Words are views into `text`, or into `storage`
  // for words a step had to rewrite (prefix space); both must outlive `words`.
  void split(std::string_view text, std::vector<std::string_view>& words,
             std::deque<std::string>& storage) const;

 private:
  struct Step {
    Regex regex;                    // empty: no splitting in this step
    bool add_prefix_space = false;  // only ByteLevel steps set it
  };
  std::vector<Step> steps_;
};

// The word pattern of GPT-2's ByteLevel pre-tokenizer (use_regex = true).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The pattern transformers' Qwen2Tokenizer uses (vocab.json + merges.txt folders carry no
// pre-tokenizer description; tokenizer.json files spell out the same pattern).
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace epmoe
