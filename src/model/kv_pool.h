// The paged KV cache's bookkeeping, the same on every device: one pool of fixed-size blocks
// allocated when the model is built, a block table per sequence (KvCache), reference counts for
// blocks that several sequences share (the n samples of one prompt: copy on write at the first
// block they write differently), and a prefix cache of full blocks keyed by the tokens of the
// whole prefix up to and including the block (a hash chain, checked token by token on a hit).
// The match is token by token: after the longest chain of full blocks, the cached block after it
// that shares the most leading tokens with the prompt gives those rows too -- copied into a block
// of the new sequence's own (its other rows are the sequence's to write), so a prompt that
// shares 20 tokens of a cached one reuses 20, not 16.
//
// The pool never touches the K/V values: the model owning it stores them ([layer][block][row]) and
// gives the pool a copier for copy on write. What the pool guarantees the scheduler:
//   - a block a sequence is promised (reserve / admit) is there when the sequence writes;
//   - a block comes back when the last sequence holding it ends (KvCache's destructor);
//   - a full block stays findable by its prefix until it is evicted to make room (LRU).
// Reuse is exact: a cached block holds the bits the same prefix computes (the kernels are
// batch-invariant and attention sums its keys in position order whatever the blocks).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "util/error.h"

namespace epmoe {

class KvPool;

// A sequence's block table: blocks()[i] holds its positions [i * B, (i + 1) * B).
class KvCache {
 public:
  explicit KvCache(KvPool& pool) : pool_(&pool) {}
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const std::vector<int32_t>& blocks() const { return blocks_; }
  int64_t tokens() const { return tokens_; }      // positions written (or being written this step)
  int64_t reserved() const { return reserved_; }  // blocks promised to it and not yet taken
  KvPool& pool() const { return *pool_; }

 private:
  friend class KvPool;
  KvPool* pool_;
  std::vector<int32_t> blocks_;
  std::vector<uint64_t> chain_;  // prefix hash of each full block
  std::vector<int32_t> tail_;    // the tokens of the last, partial block
  int64_t tokens_ = 0;
  int64_t reserved_ = 0;
};

// Thrown when a write needs a block and none is free or promised: the scheduler admits only what
// fits, so this reaches a user only through a direct forward beyond --kv-cache-tokens.
struct KvPoolFull : InputError {
  using InputError::InputError;
};

class KvPool {
 public:
  // copy(src, dst): the device copies block src's K/V rows (every layer) into block dst.
  KvPool(int64_t blocks, int block_tokens, std::function<void(int32_t, int32_t)> copy = {});
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;
  void set_copier(std::function<void(int32_t, int32_t)> copy) { copy_ = std::move(copy); }

  int block_tokens() const { return block_tokens_; }
  int64_t total_blocks() const { return int64_t(meta_.size()); }
  int64_t used_blocks() const;                                   // held by a live sequence
  int64_t cached_blocks() const { return int64_t(lru_.size()); }  // free, but findable by prefix
  int64_t reserved_blocks() const { return reserved_; }
  // Blocks that can still be promised: free + cached - promised.
  int64_t available() const { return int64_t(free_.size() + lru_.size()) - reserved_; }
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_tokens_ - 1) / block_tokens_; }
  // Prefix-cache counters since the start (blocks): looked up at admission and found.
  int64_t prefix_lookups() const { return lookups_; }
  int64_t prefix_hits() const { return hits_; }
  int64_t partial_hit_tokens() const { return partial_hits_; }  // rows found in partial blocks

  // A new, empty sequence cache (no promise: its writes take unpromised blocks or throw).
  std::shared_ptr<KvCache> open();

  // Admission of a request: a cache holding the longest cached prefix of `prompt` (at most
  // `match_limit` tokens: full blocks, then the leading rows of one more when the pool has a
  // copier), with the blocks a sequence of `worst_tokens` positions may still
  // need promised to it, plus `extra` promised blocks (for forks: see fork). nullptr when that
  // does not fit now (nothing taken); the prefix length is the cache's tokens().
  std::shared_ptr<KvCache> admit(const std::vector<int32_t>& prompt, int64_t match_limit, int64_t worst_tokens,
                                 int64_t extra = 0);

  // A second sequence sharing every block of `parent` (copy on write), taking `promised` of the
  // parent's promised blocks.
  std::shared_ptr<KvCache> fork(KvCache& parent, int64_t promised);

  // Makes room for tokens [c.tokens(), c.tokens() + n) and records them: copies the partial last
  // block first when another sequence shares it, takes new blocks (promised ones first), and
  // publishes each block that becomes full to the prefix cache.
  void append(KvCache& c, const int32_t* tokens, int64_t n);

  // Forgets every cached prefix (the weights changed, or a user asked): cached blocks become free.
  void flush_prefix_cache();

  // Releases c's blocks and promises (KvCache's destructor).
  void release(KvCache& c);

 private:
  struct Block {
    int32_t refs = 0;
    bool published = false;
    uint64_t hash = 0;
    std::vector<int32_t> tokens;        // the block's own tokens, when published (checks a hit)
    uint64_t parent_hash = 0;           // the chain hash before it (checks a hit)
    std::list<int32_t>::iterator lru;   // valid while cached (refs == 0 and published)
  };
  int32_t take(KvCache& c);  // a block for c: promised first, else unpromised, else KvPoolFull
  void unref(int32_t b);
  void ref(int32_t b);
  static uint64_t chain_hash(uint64_t parent, const int32_t* tokens, int n);

  int block_tokens_;
  std::vector<Block> meta_;
  std::vector<int32_t> free_;  // never-published free blocks (a stack)
  std::list<int32_t> lru_;     // published blocks no sequence holds, least recently used first
  std::unordered_map<uint64_t, int32_t> index_;  // chain hash -> published block
  // parent chain hash -> published blocks that follow it (the candidates of a partial match)
  std::unordered_multimap<uint64_t, int32_t> children_;
  void unpublish(int32_t b);
  int64_t reserved_ = 0;
  int64_t lookups_ = 0, hits_ = 0, partial_hits_ = 0;
  std::function<void(int32_t, int32_t)> copy_;
};

}  // namespace epmoe
