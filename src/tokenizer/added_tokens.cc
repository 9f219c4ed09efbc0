#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "tokenizer/regex.h"

namespace epmoe {
namespace {

// tokenizers decides lstrip / rstrip / single_word with Rust regex's Unicode \s and \w:
// White_Space, and Alphabetic + marks + decimal digits + connector punctuation + Join_Control.
const Regex& space_char() {
  static const Regex r = Regex::compile("\\p{White_Space}", "added token whitespace class");
  return r;
}
const Regex& word_char() {
  static const Regex r = Regex::compile("[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]",
                                        "added token word class");
  return r;
}

bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The character ending just before `pos` / starting at `pos`.
std::string_view char_before(std::string_view s, size_t pos) {
  size_t b = pos;
  while (b > 0 && is_continuation(s[--b])) {
  }
  return s.substr(b, pos - b);
}
std::string_view char_at(std::string_view s, size_t pos) {
  size_t e = pos + 1;
  while (e < s.size() && is_continuation(s[e])) ++e;
  return s.substr(pos, e - pos);
}

}  // namespace

void assign_added_token_ids(std::vector<AddedToken>& tokens, const Vocab& vocab) {
  std::erase_if(tokens, [](const AddedToken& t) { return t.content.empty(); });
  const auto vocab_size = static_cast<int64_t>(vocab.size());
  std::unordered_map<std::string_view, int32_t> assigned;
  int64_t max_id = -1;  // largest id handed out to an added token so far
  for (AddedToken& t : tokens) {
    if (auto a = assigned.find(t.content); a != assigned.end()) {
      t.id = a->second;
    } else if (auto v = vocab.find(t.content); v != vocab.end()) {
      t.id = v->second;
    } else {
      t.id =
          static_cast<int32_t>(max_id >= vocab_size || vocab_size == 0 ? max_id + 1 : vocab_size);
    }
    assigned.emplace(t.content, t.id);
    max_id = std::max<int64_t>(max_id, t.id);
  }
}

void AddedTokenMatcher::add(const AddedToken* token, std::string pattern) {
  if (pattern.empty()) return;  // tokenizers ignores empty added tokens
  const auto index = static_cast<uint32_t>(entries_.size());
  auto& bucket = by_first_byte_[static_cast<uint8_t>(pattern[0])];
  entries_.push_back({std::move(pattern), token});
  bucket.push_back(index);
  std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
    return entries_[a].pattern.size() > entries_[b].pattern.size();
  });
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Piece>& out) const {
  size_t done = 0;  // text before this is already covered by pieces
  size_t pos = 0;
  while (pos < text.size()) {
    const Entry* hit = nullptr;
    for (uint32_t i : by_first_byte_[static_cast<uint8_t>(text[pos])]) {
      const std::string& p = entries_[i].pattern;
      if (p.size() <= text.size() - pos &&
          std::memcmp(text.data() + pos, p.data(), p.size()) == 0) {
        hit = &entries_[i];
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + hit->pattern.size();
    pos = end;  // scanning resumes after the match whether or not it is kept
    const AddedToken& tok = *hit->token;
    if (tok.single_word) {
      const bool word_before = begin > 0 && word_char().full_match(char_before(text, begin));
      const bool word_after = end < text.size() && word_char().full_match(char_at(text, end));
      if (word_before || word_after) continue;
    }
    if (tok.lstrip) {
      // Never reach back into a previous match.
      while (begin > done && space_char().full_match(char_before(text, begin)))
        begin -= char_before(text, begin).size();
    }
    if (tok.rstrip) {
      while (end < text.size() && space_char().full_match(char_at(text, end)))
        end += char_at(text, end).size();
      pos = end;
    }
    if (done < begin) out.push_back({done, begin, -1});
    out.push_back({begin, end, tok.id});
    done = end;
  }
  if (done < text.size()) out.push_back({done, text.size(), -1});
}

}  // namespace epmoe
