// A bounded, thread-safe cache word -> token ids. Text repeats its words a lot (" the", "\n"),
// and a hit skips the whole merge loop. Like tokenizers' BPE cache it stops growing when full
// instead of evicting: the first words seen are the frequent ones.
#pragma once

#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"

namespace epmoe {

class WordCache {
 public:
  static constexpr size_t kMaxEntries = 1 << 17;
  static constexpr size_t kMaxWordBytes = 256;  // long words are rare and costly to key

  // Appends the cached ids of `word` to `out`; false when it is not cached.
  bool lookup(std::string_view word, std::vector<int32_t>& out) const {
    std::shared_lock lock(mu_);
    auto it = map_.find(word);
    if (it == map_.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }

  void insert(std::string_view word, const int32_t* ids, size_t n) {
    if (word.size() > kMaxWordBytes) return;
    // Another thread filling the cache is no reason to wait: the entry is only an optimisation.
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || map_.size() >= kMaxEntries) return;
    map_.try_emplace(std::string(word), ids, ids + n);
  }

 private:
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map_;
};

}  // namespace epmoe
