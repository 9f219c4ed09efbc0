#include "model/kv_pool.h"

#include <algorithm>

#include "util/hash.h"

namespace epmoe {

KvCache::~KvCache() { pool_->release(*this); }

KvPool::KvPool(int64_t blocks, int block_tokens, std::function<void(int32_t, int32_t)> copy)
    : block_tokens_(block_tokens), copy_(std::move(copy)) {
  EPMOE_ASSERT(blocks > 0 && blocks < INT32_MAX, "kv pool: " + std::to_string(blocks) + " blocks");
  EPMOE_ASSERT(block_tokens > 0, "kv pool: block of " + std::to_string(block_tokens) + " tokens");
  meta_.resize(size_t(blocks));
  // Handed out lowest first (the stack's top is block 0): a small workload touches little memory.
  for (int64_t b = blocks - 1; b >= 0; b--) free_.push_back(int32_t(b));
}

int64_t KvPool::used_blocks() const { return total_blocks() - int64_t(free_.size() + lru_.size()); }

uint64_t KvPool::chain_hash(uint64_t parent, const int32_t* tokens, int n) {
  uint64_t h = splitmix64(parent ^ 0x6b7650726566ull);  // "kvPref": apart from other uses of the mixer
  for (int i = 0; i < n; i++) h = splitmix64(h ^ uint64_t(uint32_t(tokens[i])));
  return h;
}

void KvPool::ref(int32_t b) {
  Block& m = meta_[size_t(b)];
  if (m.refs == 0) {
    EPMOE_ASSERT(m.published, "kv pool: block " + std::to_string(b) + " referenced while free");
    lru_.erase(m.lru);
  }
  m.refs++;
}

void KvPool::unref(int32_t b) {
  Block& m = meta_[size_t(b)];
  EPMOE_ASSERT(m.refs > 0, "kv pool: block " + std::to_string(b) + " released twice");
  if (--m.refs > 0) return;
  if (m.published) {
    m.lru = lru_.insert(lru_.end(), b);
  } else {
    free_.push_back(b);
  }
}

int32_t KvPool::take(KvCache& c) {
  if (c.reserved_ > 0) {
    c.reserved_--;
    reserved_--;
  } else if (available() <= 0) {
    throw KvPoolFull("KV cache pool full: all " + std::to_string(total_blocks()) + " blocks of " +
                     std::to_string(block_tokens_) + " tokens are in use or promised (raise --kv-cache-tokens)");
  }
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    // Evict the least recently used cached prefix block.
    EPMOE_ASSERT(!lru_.empty(), "kv pool: no block to take although one is available");
    b = lru_.front();
    lru_.pop_front();
    unpublish(b);
  }
  meta_[size_t(b)].refs = 1;
  return b;
}

void KvPool::unpublish(int32_t b) {
  Block& m = meta_[size_t(b)];
  auto it = index_.find(m.hash);
  if (it != index_.end() && it->second == b) index_.erase(it);
  for (auto [c, end] = children_.equal_range(m.parent_hash); c != end; ++c)
    if (c->second == b) {
      children_.erase(c);
      break;
    }
  m.published = false;
  m.tokens.clear();
}

std::shared_ptr<KvCache> KvPool::open() { return std::make_shared<KvCache>(*this); }

std::shared_ptr<KvCache> KvPool::admit(const std::vector<int32_t>& prompt, int64_t match_limit, int64_t worst_tokens,
                                       int64_t extra) {
  const int B = block_tokens_;
  // The longest chain of cached full blocks that is a prefix of the prompt.
  std::vector<int32_t> hit;
  std::vector<uint64_t> chain;
  uint64_t parent = 0;
  const int64_t limit = std::min<int64_t>(match_limit, int64_t(prompt.size())) / B;
  for (int64_t i = 0; i < limit; i++) {
    const int32_t* t = prompt.data() + i * B;
    const uint64_t h = chain_hash(parent, t, B);
    auto it = index_.find(h);
    if (it == index_.end()) break;
    const Block& m = meta_[size_t(it->second)];
    if (m.parent_hash != parent || !std::equal(t, t + B, m.tokens.begin())) break;  // a collision
    hit.push_back(it->second);
    chain.push_back(h);
    parent = h;
  }
  // Then the cached block after that chain sharing the most leading tokens with the prompt (the
  // ties to the lower block id: a fixed choice). Its rows hold the bits this prompt computes there.
  const int64_t full = int64_t(hit.size()) * B;
  const int64_t room = std::min<int64_t>(std::min<int64_t>(match_limit, int64_t(prompt.size())) - full, B - 1);
  int32_t partial = -1;
  int64_t rows = 0;
  if (copy_ && room > 0)
    for (auto [it, end] = children_.equal_range(parent); it != end; ++it) {
      const Block& m = meta_[size_t(it->second)];
      if (!m.published || m.parent_hash != parent) continue;
      int64_t j = 0;
      while (j < room && m.tokens[size_t(j)] == prompt[size_t(full + j)]) j++;
      if (j > rows || (j == rows && j > 0 && it->second < partial)) rows = j, partial = it->second;
    }
  int64_t from_lru = 0;
  for (int32_t b : hit) from_lru += meta_[size_t(b)].refs == 0;
  // (the partial block is held while it is copied: it must not be the one taken for the copy)
  if (partial >= 0) from_lru += meta_[size_t(partial)].refs == 0;
  const int64_t need = std::max<int64_t>(0, blocks_for(worst_tokens) - int64_t(hit.size())) + extra;
  if (available() < need + from_lru) return nullptr;
  lookups_ += limit;
  hits_ += int64_t(hit.size());
  auto c = std::make_shared<KvCache>(*this);
  for (int32_t b : hit) ref(b);
  c->blocks_ = std::move(hit);
  c->chain_ = std::move(chain);
  c->tokens_ = full;
  c->reserved_ = need;
  reserved_ += need;
  if (partial >= 0) {
    ref(partial);
    const int32_t own = take(*c);  // one of the blocks promised: the sequence's block after `full`
    copy_(partial, own);
    unref(partial);
    c->blocks_.push_back(own);
    c->tail_.assign(prompt.begin() + full, prompt.begin() + full + rows);
    c->tokens_ = full + rows;
    partial_hits_ += rows;
  }
  return c;
}

std::shared_ptr<KvCache> KvPool::fork(KvCache& parent, int64_t promised) {
  EPMOE_ASSERT(promised <= parent.reserved_, "kv pool: fork takes " + std::to_string(promised) +
                                                 " promised blocks of a parent holding " +
                                                 std::to_string(parent.reserved_));
  auto c = std::make_shared<KvCache>(*this);
  for (int32_t b : parent.blocks_) ref(b);
  c->blocks_ = parent.blocks_;
  c->chain_ = parent.chain_;
  c->tail_ = parent.tail_;
  c->tokens_ = parent.tokens_;
  parent.reserved_ -= promised;
  c->reserved_ = promised;
  return c;
}

void KvPool::append(KvCache& c, const int32_t* tokens, int64_t n) {
  if (n <= 0) return;
  const int B = block_tokens_;
  if (c.tokens_ % B != 0) {
    // Copy on write: the partial block this write lands in is shared with another sequence.
    int32_t& last = c.blocks_.back();
    if (meta_[size_t(last)].refs > 1) {
      EPMOE_ASSERT(copy_, "kv pool: a shared block is written but the pool has no copier");
      const int32_t fresh = take(c);
      copy_(last, fresh);
      unref(last);
      last = fresh;
    }
  }
  while (int64_t(c.blocks_.size()) * B < c.tokens_ + n) c.blocks_.push_back(take(c));
  for (int64_t i = 0; i < n; i++) {
    c.tail_.push_back(tokens[i]);
    c.tokens_++;
    if (int(c.tail_.size()) < B) continue;
    const uint64_t parent = c.chain_.empty() ? 0 : c.chain_.back();
    const uint64_t h = chain_hash(parent, c.tail_.data(), B);
    const int32_t b = c.blocks_[c.chain_.size()];
    c.chain_.push_back(h);
    Block& m = meta_[size_t(b)];
    if (!m.published && !index_.count(h)) {  // the first block of this prefix is the one found
      m.published = true;
      m.hash = h;
      m.parent_hash = parent;
      m.tokens = c.tail_;
      index_[h] = b;
      children_.emplace(parent, b);
    }
    c.tail_.clear();
  }
}

void KvPool::flush_prefix_cache() {
  index_.clear();
  children_.clear();
  for (int32_t b : lru_) free_.push_back(b);
  lru_.clear();
  for (Block& m : meta_) {
    m.published = false;
    m.tokens.clear();
  }
}

void KvPool::release(KvCache& c) {
  for (int32_t b : c.blocks_) unref(b);
  c.blocks_.clear();
  reserved_ -= c.reserved_;
  c.reserved_ = 0;
}

}  // namespace epmoe
