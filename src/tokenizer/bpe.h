// Byte-level BPE: turns one pre-tokenized word into token ids by applying merges in rank order.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace epmoe {

// Hash that lets unordered_map<std::string, ...> be searched with a string_view, no copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Token spelling (in the byte-level alphabet, e.g. "Ġthe") -> id.
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct MergeRule {
  std::string left, right;  // spellings, as in merges.txt "left right"
};

// Open-addressing map (left id, right id) -> (rank, merged id). Looked up several times per
// byte of input, so it is kept flat: one probe usually lands on the entry.
class MergeTable {
 public:
  struct Value {
    int32_t rank;
    int32_t id;
  };
  void reserve(size_t n);
  void insert(int32_t left, int32_t right, Value v);  // a later insert of a pair replaces it
  const Value* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t k = key(left, right);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are >= 0, so no real key is all ones
  struct Slot {
    uint64_t key = kEmpty;
    Value value{};
  };
  static uint64_t key(int32_t l, int32_t r) {
    return (uint64_t{static_cast<uint32_t>(l)} << 32) | static_cast<uint32_t>(r);
  }
  size_t slot(uint64_t k) const { return (k * 0x9E3779B97F4A7C15ull) >> shift_; }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

class Bpe {
 public:
  Bpe() = default;

  // `merges` are in rank order (the first is applied first). A merge naming a token that is not
  // in `vocab`, or whose result is not, is an InputError naming `source` (the file).
  // ignore_merges: a word that is itself a vocabulary entry is emitted whole (Llama 3 style).
  Bpe(Vocab vocab, const std::vector<MergeRule>& merges, bool ignore_merges,
      const std::string& source);

  // Appends the ids of one word, given as raw bytes (not yet in the byte-level alphabet).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  const Vocab& vocab() const { return vocab_; }
  size_t num_merges() const { return merges_.size(); }

 private:
  Vocab vocab_;
  MergeTable merges_;
  std::array<int32_t, 256> byte_id_{};  // id of each single-byte token, -1 if absent
  bool ignore_merges_ = false;
};

}  // namespace epmoe
