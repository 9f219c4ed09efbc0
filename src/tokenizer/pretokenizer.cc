#include "tokenizer/pretokenizer.h"

#include <utility>

namespace epmoe {

void PreTokenizer::add_split(Regex regex) { steps_.push_back({std::move(regex), false}); }

void PreTokenizer::add_byte_level(bool add_prefix_space, bool use_regex) {
  Step s;
  s.add_prefix_space = add_prefix_space;
  if (use_regex) s.regex = Regex::compile(kGpt2Pattern, "ByteLevel pre-tokenizer");
  if (!s.add_prefix_space && s.regex.empty()) return;  // a no-op for words of raw bytes
  steps_.push_back(std::move(s));
}

namespace {

// Isolated split: the matches and the gaps between them, in order, none empty.
void split_isolated(const Regex& regex, std::string_view word, std::vector<std::string_view>& out,
                    std::vector<std::pair<size_t, size_t>>& matches) {
  matches.clear();
  regex.find_all(word, matches);
  size_t done = 0;
  for (auto [b, e] : matches) {
    if (done < b) out.push_back(word.substr(done, b - done));
    out.push_back(word.substr(b, e - b));
    done = e;
  }
  if (done < word.size()) out.push_back(word.substr(done));
}

}  // namespace

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& words,
                         std::deque<std::string>& storage) const {
  if (text.empty()) return;
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  if (steps_.empty()) {
    words.push_back(text);
    return;
  }
  // Each step rewrites the whole list of words; most tokenizers have exactly one step, which
  // then writes straight into `words`.
  std::vector<std::string_view> current{text}, next;
  for (size_t s = 0; s < steps_.size(); ++s) {
    const Step& step = steps_[s];
    std::vector<std::string_view>& dst = s + 1 == steps_.size() ? words : next;
    if (&dst == &next) next.clear();
    for (std::string_view w : current) {
      if (step.add_prefix_space && w.front() != ' ') {
        storage.push_back(" " + std::string(w));
        w = storage.back();
      }
      if (step.regex.empty()) {
        dst.push_back(w);
      } else {
        split_isolated(step.regex, w, dst, matches);
      }
    }
    if (&dst == &next) current.swap(next);
  }
}

}  // namespace epmoe
