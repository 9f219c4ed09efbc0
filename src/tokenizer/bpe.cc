#include "tokenizer/bpe.h"

#include <algorithm>

#include "tokenizer/byte_level.h"
#include "util/error.h"

namespace epmoe {

void MergeTable::reserve(size_t n) {
  int bits = 4;
  while ((size_t{1} << bits) < n * 2) ++bits;  // load factor <= 1/2 keeps probes short
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(size_t{1} << bits, Slot{});
  mask_ = slots_.size() - 1;
  shift_ = 64 - bits;
  size_ = 0;
  for (const Slot& s : old) {
    if (s.key != kEmpty)
      insert(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key), s.value);
  }
}

void MergeTable::insert(int32_t left, int32_t right, Value v) {
  if ((size_ + 1) * 2 > slots_.size()) reserve(size_ + 1);
  const uint64_t k = key(left, right);
  for (size_t i = slot(k);; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == k) {
      s.value = v;
      return;
    }
    if (s.key == kEmpty) {
      s.key = k;
      s.value = v;
      ++size_;
      return;
    }
  }
}

Bpe::Bpe(Vocab vocab, const std::vector<MergeRule>& merges, bool ignore_merges,
         const std::string& source)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges) {
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_level::char_for_byte(static_cast<uint8_t>(b)));
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
  merges_.reserve(merges.size());
  auto id_of = [&](const std::string& token, size_t rank, const MergeRule& m) {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) {
      throw InputError(source + ": merge " + std::to_string(rank + 1) + " '" + m.left + " " +
                       m.right + "' needs token '" + token + "', which is not in the vocabulary");
    }
    return it->second;
  };
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const MergeRule& m = merges[rank];
    joined.assign(m.left).append(m.right);
    const int32_t l = id_of(m.left, rank, m), r = id_of(m.right, rank, m);
    // A repeated pair keeps its last rank, as both transformers and tokenizers build the map.
    merges_.insert(l, r, {static_cast<int32_t>(rank), id_of(joined, rank, m)});
  }
}

namespace {

struct Symbol {
  int32_t id;
  int32_t prev, next;  // neighbours in the linked list, -1 at the ends
  bool alive;          // false once merged into its left neighbour
};

struct Candidate {
  int32_t rank, pos, new_id;
  // Min-heap order: lowest rank first, then the leftmost position.
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(byte_level::encode(word));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Scratch buffers reused across words; thread_local keeps concurrent encodes independent.
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Candidate> heap;
  sym.clear();
  heap.clear();
  for (char c : word) {
    const int32_t id = byte_id_[static_cast<uint8_t>(c)];
    // Without an unknown token, tokenizers drops a character missing from the vocabulary.
    if (id < 0) continue;
    const auto i = static_cast<int32_t>(sym.size());
    sym.push_back({id, i - 1, i + 1, true});
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  // The linked list plus a heap of candidate pairs makes the loop O(n log n) in the word length
  // (a naive rescan per merge is O(n^2), which long runs of one character would hit).
  auto consider = [&](int32_t pos) {
    const int32_t next = sym[pos].next;
    if (const MergeTable::Value* m = merges_.find(sym[pos].id, sym[next].id)) {
      heap.push_back({m->rank, pos, m->id});
      std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[left.next];
    // The entry is stale if either side has merged since it was queued: the current pair then
    // maps to another token (or to none).
    const MergeTable::Value* m = merges_.find(left.id, right.id);
    if (!m || m->id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) sym[left.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    if (left.next >= 0) consider(top.pos);
  }
  // Merges always fold a symbol into its left neighbour, so symbol 0 heads the list.
  for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

}  // namespace epmoe
