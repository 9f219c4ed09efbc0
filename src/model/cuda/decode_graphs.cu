#include "model/cuda/decode_graphs.cuh"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

namespace epmoe::cuda {

void DecodeGraphs::set(bool on) {
  on_ = on;
  if (!on) graphs_.clear();
}

GpuGraphStats DecodeGraphs::stats() const {
  GpuGraphStats s = stats_;
  s.cached = int64_t(graphs_.size());
  return s;
}

void DecodeGraphs::note_layout(std::vector<const void*> layout) {
  if (layout != layout_) layout_ = std::move(layout), epoch_++;
}

void DecodeGraphs::note_eager_step(uintptr_t backend, int64_t T, std::vector<const void*> layout) {
  stats_.eager_steps++;
  if (seen_.insert({backend, T}).second) epoch_++;
  note_layout(std::move(layout));
}

int DecodeGraphs::ctx_bucket(int max_ctx, int row_width) {
  int c = 256;
  while (c < max_ctx && c < 4096) c *= 2;
  if (c < max_ctx) c = (max_ctx + 4095) / 4096 * 4096;
  const int limit = int(200 * 1024 / sizeof(float)) - row_width;
  return std::max(max_ctx, std::min(c, limit));
}

bool DecodeGraphs::run(uintptr_t backend, int64_t B, int cap, int block_tokens, const StepInputsHost& in,
                       cudaStream_t s, const std::function<void()>& prepare,
                       const std::function<void(const StepInputs&)>& record) {
  if (!seen_.count({backend, B})) return false;
  static_assert(sizeof(TokenSlot) == 8 && sizeof(uint64_t) == 8, "graph input layout");
  const Key key{B, cap, backend};
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) {
      auto lru = graphs_.begin();
      for (auto j = graphs_.begin(); j != graphs_.end(); ++j)
        if (j->second->last_use < lru->second->last_use) lru = j;
      graphs_.erase(lru);
    }
    it = graphs_.emplace(key, std::make_unique<Entry>()).first;
  }
  Entry& e = *it->second;
  e.last_use = ++use_clock_;
  const size_t b = size_t(B), n_tab = in.tables.size();
  if (n_tab > e.tables_cap || e.in_dev.empty()) {
    const size_t bt = size_t(block_tokens);
    e.tables_cap = std::max(n_tab, b * ((size_t(cap) + bt - 1) / bt + 1));
    e.in_dev.reserve(24 * b + 4 * e.tables_cap);
    e.in_host.reserve(24 * b + 4 * e.tables_cap);
    e.epoch = 0;  // its graph read the old buffer
  }
  unsigned char* h = e.in_host.data();
  std::memcpy(h, in.gids.data(), 8 * b);
  std::memcpy(h + 8 * b, in.slots.data(), 8 * b);
  std::memcpy(h + 16 * b, in.ids.data(), 4 * b);
  std::memcpy(h + 20 * b, in.sel.data(), 4 * b);
  if (n_tab) std::memcpy(h + 24 * b, in.tables.data(), 4 * n_tab);
  // (The previous step ended in a synchronising download: the pinned buffer is free to write.)
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(e.in_dev.data(), h, 24 * b + 4 * n_tab, cudaMemcpyHostToDevice, s));
  prepare();
  if ((!e.exec || e.epoch != epoch_) && !capture(e, B, s, record)) return false;
  EPMOE_CUDA_CHECK(cudaGraphLaunch(e.exec, s));
  stats_.replays++;
  return true;
}

bool DecodeGraphs::capture(Entry& e, int64_t B, cudaStream_t s, const std::function<void(const StepInputs&)>& record) {
  const unsigned char* d = e.in_dev.data();
  const size_t b = size_t(B);
  StepInputs in;
  in.gids = reinterpret_cast<const uint64_t*>(d);
  in.slots = reinterpret_cast<const TokenSlot*>(d + 8 * b);
  in.ids = reinterpret_cast<const int32_t*>(d + 16 * b);
  in.sel = reinterpret_cast<const int32_t*>(d + 20 * b);
  in.tables = reinterpret_cast<const int32_t*>(d + 24 * b);
  cudaGraph_t g = nullptr;
  try {
    // Thread-local mode: a call in the body that is not allowed while capturing (a synchronous
    // copy, an allocation that frees) fails here instead of being recorded wrongly.
    EPMOE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    try {
      record(in);
    } catch (...) {
      cudaGraph_t bad = nullptr;
      (void)cudaStreamEndCapture(s, &bad);
      if (bad) cudaGraphDestroy(bad);
      throw;
    }
    EPMOE_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    if (e.exec) {
      cudaGraphExecUpdateResultInfo info;
      if (cudaGraphExecUpdate(e.exec, g, &info) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaGraphExecDestroy(e.exec);
        e.exec = nullptr;
      }
    }
    if (!e.exec) EPMOE_CUDA_CHECK(cudaGraphInstantiate(&e.exec, g, 0));
    EPMOE_CUDA_CHECK(cudaGraphDestroy(g));
  } catch (const std::exception& ex) {
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
    std::fprintf(stderr, "epmoe: capturing a decode step as a CUDA graph failed (%s); decoding eagerly from now on\n",
                 ex.what());
    set(false);
    return false;
  }
  e.epoch = epoch_;
  stats_.captures++;
  return true;
}

}  // namespace epmoe::cuda
