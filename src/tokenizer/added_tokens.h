// Added tokens (special tokens such as <|im_start|>, and user-added words) are cut out of the
// text before any normalisation or BPE, exactly like tokenizers' AddedVocabulary: leftmost
// match first, the longest token on a tie, with the lstrip / rstrip / single_word options.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/bpe.h"

namespace epmoe {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;      // skipped by decode(skip_special = true)
  bool normalized = false;   // matched in the normalised text instead of the raw text
  bool lstrip = false;       // swallows the whitespace on its left
  bool rstrip = false;       // swallows the whitespace on its right
  bool single_word = false;  // only matches when not inside a word
};

// Gives each added token the id tokenizers gives it when it loads a file: the id of the same
// content if that is already a vocabulary entry (or an earlier added token), otherwise the next
// free id after the vocabulary. The ids written in the file only feed a warning there; for
// consistent files (all real ones) the result is the same. Tokens with empty content are
// dropped, as tokenizers ignores them.
void assign_added_token_ids(std::vector<AddedToken>& tokens, const Vocab& vocab);

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // Matches the given tokens, each spelled as `pattern` (the content, or its NFC form for
  // normalized tokens). The tokens must outlive the matcher.
  void add(const AddedToken* token, std::string pattern);

  struct Piece {
    size_t begin, end;
    int32_t id;  // -1: plain text to be tokenized further
  };
  // Covers `text` (well-formed UTF-8) with pieces in order, appending them to `out`.
  void split(std::string_view text, std::vector<Piece>& out) const;

  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    std::string pattern;
    const AddedToken* token;
  };
  std::vector<Entry> entries_;
  // Entries indexed by first byte, longest first: the first hit at a position is the longest.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
};

}  // namespace epmoe
