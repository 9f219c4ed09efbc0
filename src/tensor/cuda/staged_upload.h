// Host -> device uploads of a whole checkpoint at the link's rate (issue 33: 56.9 GiB took 145 s,
// 0.4 GB/s, when each tensor was converted to fp32 on one thread and copied with a synchronous
// cudaMemcpy from pageable memory).
//
// Worker threads fill pinned staging buffers straight from the mmapped checkpoint -- converting
// or interleaving rows as they copy -- and queue each full buffer on a copy stream of their own;
// nothing waits per tensor. Each worker owns two buffers and fills one while the other is in
// flight, so the page cache, the CPU copies and the PCIe link all stay busy. finish() waits for
// the last copy; until then the destinations must not be read and the sources must stay mapped.
//
// No CUDA types here: destinations are device addresses, the stream lives in the .cu.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace epmoe::cuda {

class StagedUploader {
 public:
  // Writes bytes [offset, offset + len) of a destination region into `staging` (pinned memory).
  using Fill = std::function<void(char* staging, size_t offset, size_t len)>;

  // threads: workers at most (0: the cores available, at most 16), started as pieces queue up;
  // buffer_bytes: each of their two staging buffers. `what` names the load in the progress lines and errors ("weights of rank 0").
  explicit StagedUploader(std::string what, int threads = 0, size_t buffer_bytes = size_t(32) << 20);
  ~StagedUploader();  // drops pieces not started, waits for the others; errors are dropped (finish() reports them)
  StagedUploader(const StagedUploader&) = delete;
  StagedUploader& operator=(const StagedUploader&) = delete;

  // Queues bytes [0, n) of the device region `dst`, filled piece by piece by `fill` (pieces of at
  // most buffer_bytes, in any order, on any worker). `fill` must stay callable until finish().
  void enqueue(void* dst, size_t n, Fill fill);
  // A plain host range (already in the destination's layout).
  void enqueue_copy(void* dst, const void* src, size_t n);

  // The bytes the progress line counts towards (the sum of what will be enqueued, when known in
  // advance); without it, what has been enqueued so far.
  void expect_bytes(size_t n);

  // Waits until every queued byte is on the device; rethrows the first error of a fill or a copy
  // (with what failed). The uploader can be used again afterwards.
  void finish();

  size_t bytes_done() const;
  double seconds() const;  // since construction

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace epmoe::cuda
