// StagedUploader (tensor/cuda/staged_upload.h): workers, each with its own stream and two pinned
// buffers; a queue of pieces; progress on stderr for loads that take more than a couple of seconds.
#include "tensor/cuda/staged_upload.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "util/error.h"

namespace epmoe::cuda {

namespace {

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw Error(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

using Clock = std::chrono::steady_clock;

}  // namespace

struct StagedUploader::Impl {
  struct Piece {
    char* dst;
    size_t offset, len;
    std::shared_ptr<const Fill> fill;
  };

  std::string what;
  size_t buffer_bytes;
  int device = 0;
  std::mutex mu;
  std::condition_variable work_cv, idle_cv;
  std::deque<Piece> queue;
  size_t outstanding = 0;  // pieces queued or being filled
  bool stop = false;
  std::exception_ptr error;
  int max_workers = 1;
  std::vector<cudaStream_t> streams;  // one per worker, set by the worker itself
  std::vector<std::thread> workers;   // started as the queue grows (a small model pins little)
  std::atomic<size_t> done{0};
  size_t expected = 0, enqueued = 0;
  Clock::time_point t0 = Clock::now(), last_print = Clock::now();
  bool printed = false;
  const bool tty = isatty(STDERR_FILENO);

  double seconds() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = e;
  }

  // Called with mu held, by a worker after a piece.
  void maybe_print() {
    const auto now = Clock::now();
    if (std::chrono::duration<double>(now - last_print).count() < 2.0) return;
    last_print = now;
    printed = true;
    const double s = seconds(), d = double(done.load()), total = double(std::max(expected, enqueued));
    const double rate = s > 0 ? d / s : 0;
    std::fprintf(stderr, "%s%s: %.1f / %.1f GB, %.2f GB/s, %.0f s left%s", tty ? "\r" : "", what.c_str(), d / 1e9,
                 total / 1e9, rate / 1e9, rate > 0 ? std::max(0.0, (total - d) / rate) : 0.0, tty ? "  " : "\n");
    std::fflush(stderr);
  }

  void worker(int w) {
    cudaStream_t stream = nullptr;
    char* buf[2] = {nullptr, nullptr};
    cudaEvent_t ev[2] = {nullptr, nullptr};
    bool ready = false;
    try {
      check(cudaSetDevice(device), what + ": cudaSetDevice");
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), what + ": a copy stream");
      for (int b = 0; b < 2; b++) {
        check(cudaHostAlloc(reinterpret_cast<void**>(&buf[b]), buffer_bytes, cudaHostAllocDefault),
              what + ": " + std::to_string(buffer_bytes) + " bytes of pinned staging memory");
        check(cudaEventCreateWithFlags(&ev[b], cudaEventDisableTiming), what + ": an event");
      }
      ready = true;
    } catch (...) {
      fail(std::current_exception());
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      streams[size_t(w)] = stream;
    }
    int cur = 0;
    for (;;) {
      Piece p;
      {
        std::unique_lock<std::mutex> lock(mu);
        work_cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) break;  // stop, and nothing left
        p = std::move(queue.front());
        queue.pop_front();
      }
      bool skip;
      {
        std::lock_guard<std::mutex> lock(mu);
        skip = error != nullptr || !ready;
      }
      if (!skip) {
        try {
          // The buffer's previous copy must be done before it is overwritten.
          check(cudaEventSynchronize(ev[cur]), what + ": waiting for a staging copy");
          (*p.fill)(buf[cur], p.offset, p.len);
          check(cudaMemcpyAsync(p.dst + p.offset, buf[cur], p.len, cudaMemcpyHostToDevice, stream),
                what + ": copy of " + std::to_string(p.len) + " bytes to the device");
          check(cudaEventRecord(ev[cur], stream), what + ": cudaEventRecord");
          cur ^= 1;
          done += p.len;
        } catch (...) {
          fail(std::current_exception());
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      maybe_print();
      if (--outstanding == 0) idle_cv.notify_all();
    }
    if (stream) cudaStreamSynchronize(stream);
    for (int b = 0; b < 2; b++) {
      if (ev[b]) cudaEventDestroy(ev[b]);
      if (buf[b]) cudaFreeHost(buf[b]);
    }
    if (stream) cudaStreamDestroy(stream);
  }
};

StagedUploader::StagedUploader(std::string what, int threads, size_t buffer_bytes) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.what = std::move(what);
  m.buffer_bytes = std::max<size_t>(buffer_bytes, 1 << 20);
  check(cudaGetDevice(&m.device), m.what + ": cudaGetDevice");
  if (threads <= 0) threads = std::clamp(int(std::thread::hardware_concurrency()), 1, 16);
  m.max_workers = threads;
  m.streams.assign(size_t(threads), nullptr);
}

StagedUploader::~StagedUploader() {
  Impl& m = *impl_;
  {
    // Without finish() (an error on the way): pieces not started are dropped, their destinations
    // may be freed already.
    std::lock_guard<std::mutex> lock(m.mu);
    m.outstanding -= m.queue.size();
    m.queue.clear();
    m.stop = true;
  }
  m.work_cv.notify_all();
  for (auto& t : m.workers) t.join();
}

void StagedUploader::enqueue(void* dst, size_t n, Fill fill) {
  if (n == 0) return;
  EPMOE_ASSERT(dst != nullptr, impl_->what + ": upload to a null device address");
  Impl& m = *impl_;
  auto f = std::make_shared<const Fill>(std::move(fill));
  {
    std::lock_guard<std::mutex> lock(m.mu);
    for (size_t off = 0; off < n; off += m.buffer_bytes) {
      m.queue.push_back({static_cast<char*>(dst), off, std::min(m.buffer_bytes, n - off), f});
      m.outstanding++;
    }
    m.enqueued += n;
    // One more worker (its stream and pinned buffers) while pieces wait for one.
    while (int(m.workers.size()) < m.max_workers && m.queue.size() > m.workers.size()) {
      const int w = int(m.workers.size());
      m.workers.emplace_back([&m, w] { m.worker(w); });
    }
  }
  m.work_cv.notify_all();
}

void StagedUploader::enqueue_copy(void* dst, const void* src, size_t n) {
  const char* s = static_cast<const char*>(src);
  enqueue(dst, n, [s](char* staging, size_t off, size_t len) { std::memcpy(staging, s + off, len); });
}

void StagedUploader::expect_bytes(size_t n) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->expected = n;
}

void StagedUploader::finish() {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  m.idle_cv.wait(lock, [&] { return m.outstanding == 0; });
  for (cudaStream_t s : m.streams)
    if (s) {
      const cudaError_t e = cudaStreamSynchronize(s);
      if (e != cudaSuccess && !m.error)
        m.error = std::make_exception_ptr(
            Error(m.what + ": a copy to the device failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"));
    }
  if (m.error) {
    std::exception_ptr e = m.error;
    m.error = nullptr;
    std::rethrow_exception(e);
  }
  if (m.printed || m.seconds() > 2.0 || m.done.load() > (size_t(1) << 30)) {  // (every load of a GB and more)
    const double s = m.seconds(), d = double(m.done.load());
    std::fprintf(stderr, "%s%s: %.1f GB in %.1f s (%.2f GB/s)\n", m.printed && m.tty ? "\r" : "", m.what.c_str(),
                 d / 1e9, s, s > 0 ? d / 1e9 / s : 0.0);
    std::fflush(stderr);
    m.printed = false;
  }
}

size_t StagedUploader::bytes_done() const { return impl_->done.load(); }
double StagedUploader::seconds() const { return impl_->seconds(); }

}  // namespace epmoe::cuda
