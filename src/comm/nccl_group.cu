#include "comm/nccl_group.h"
#include "util/env.h"
#include "comm/mpi_group.h"
#include "comm/peer_verdict.h"
#include "comm/test_fault.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include <unistd.h>

#include "comm/nccl_check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"

namespace epmoe {

namespace {

using cuda::stream;

ncclComm_t nc(void* c) { return static_cast<ncclComm_t>(c); }


// Seconds since the epoch: comparable between the processes of a host (and, roughly, of hosts).
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The side channel's timing (nccl_group.h): write after 50 ms of waiting, every 100 ms, and a
// status older than 2 s is a peer that is not waiting.
constexpr auto kStatusAfter = std::chrono::milliseconds(50);
constexpr auto kStatusEvery = std::chrono::milliseconds(100);
constexpr double kStatusStale = 2.0;

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

}  // namespace

NcclGroup& NcclGroup::world(double timeout_s) {
  static NcclGroup g(timeout_s);
  if (timeout_s > 0) g.set_timeout(timeout_s);
  return g;
}

NcclGroup::NcclGroup(double timeout_s) {
  // Under mpirun (and no EPMOE_WORLD_SIZE from scripts/gpu-launch.sh) rank and size are MPI's, the
  // GPU is the local rank's, and the NCCL unique id travels through MPI: no shared file system, so
  // `mpirun -np 16 --host a:8,b:8 epmoe serve --device cuda` spans hosts.
  MpiGroup* mpi = nullptr;
  if (!env_get("EPMOE_WORLD_SIZE")) {
    MpiGroup& m = MpiGroup::world();  // (a group of one, MPI never started, outside mpirun)
    if (m.size() > 1) mpi = &m;
  }
  size_ = mpi ? mpi->size() : std::max(1, int(env_int("EPMOE_WORLD_SIZE", 1)));
  rank_ = mpi ? mpi->rank() : size_ > 1 ? int(env_int("EPMOE_RANK", 0)) : 0;
  if (rank_ < 0 || rank_ >= size_)
    throw InputError("EPMOE_RANK=" + std::to_string(rank_) + " outside 0.." + std::to_string(size_ - 1));
  if (timeout_s > 0) timeout_s_ = timeout_s;
  else if (const char* t = env_get("EPMOE_COMM_TIMEOUT")) timeout_s_ = std::atof(t);
  // The test-only fault hook of the MPI group (comm/test_fault.h), at every wait of this group.
  if (const std::string error = arm_test_fault(); !error.empty()) throw InputError(error);
  // This host's GPU: the local rank's under mpirun (ranks of several hosts), else the rank's.
  cuda::init_device(mpi ? int(env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("PMIX_LOCAL_RANK", rank_))) : rank_);
  if (size_ == 1) return;
  // NVLink multicast (NVLS) can take a shared host's GPUs out of service: always off.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  ncclUniqueId id;
  if (mpi) {
    // Rank 0's id, and a tag naming this run's status files (nccl_group.h), to every rank through
    // one MPI collective under the group's deadline. The status files are each host's own (in
    // $TMPDIR): a timeout reads those of the peers on its host, and names a peer of another host
    // as one that has no status here.
    struct Bootstrap {
      ncclUniqueId id;
      char tag[48];
    } mine{}, got{};
    if (rank_ == 0) {
      EPMOE_NCCL_CHECK(ncclGetUniqueId(&mine.id));
      std::snprintf(mine.tag, sizeof mine.tag, "%ld-%.0f", long(getpid()), wall_seconds() * 1e3);
    }
    mpi->set_timeout(timeout_s_);
    std::vector<size_t> sizes(size_t(size_), 0);
    sizes[0] = sizeof(Bootstrap);
    mpi->allgatherv(&mine, rank_ == 0 ? sizeof(Bootstrap) : 0, &got, sizes);
    id = got.id;
    const char* tmp = env_get("TMPDIR");
    status_base_ = std::string(tmp ? tmp : "/tmp") + "/epmoe-nccl-" + got.tag + ".rank";
  } else {
    const char* file = env_get("EPMOE_NCCL_ID_FILE");
    if (!file)
      throw InputError("EPMOE_WORLD_SIZE > 1 needs EPMOE_NCCL_ID_FILE (scripts/gpu-launch.sh sets it); "
                       "or start the ranks with mpirun");
    const std::string path = file;
    status_base_ = path + ".rank";
    std::remove((status_base_ + std::to_string(rank_) + ".status").c_str());  // a previous run's
    if (rank_ == 0) {
      EPMOE_NCCL_CHECK(ncclGetUniqueId(&id));
      const std::string tmp = path + ".tmp";
      {
        std::ofstream f(tmp, std::ios::binary);
        f.write(reinterpret_cast<const char*>(&id), sizeof id);
        if (!f) throw Error("rank 0: cannot write the NCCL id to " + tmp);
      }
      if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Error("rank 0: cannot rename " + tmp);
    } else {
      const auto start = std::chrono::steady_clock::now();
      for (;;) {
        std::ifstream f(path, std::ios::binary);
        if (f && f.read(reinterpret_cast<char*>(&id), sizeof id)) break;
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s_)
          throw Error("rank " + std::to_string(rank_) + ": no NCCL id in " + path + " after " +
                      std::to_string(timeout_s_) + " s (did rank 0 start?)");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }
  // ncclCommInitRank blocks until every rank has joined, with no deadline of its own: a watchdog
  // thread gives it the group's. Each rank says it has arrived by writing its status file first;
  // when the deadline passes, the ranks without one are named and the group is aborted.
  write_status("creating the group");
  std::mutex m;
  std::condition_variable cv;
  bool created = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(m);
    if (cv.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] { return created; })) return;
    std::vector<int> absent;
    for (int p = 0; p < size_; p++)
      if (p != rank_ && !std::ifstream(status_base_ + std::to_string(p) + ".status")) absent.push_back(p);
    const std::string who = absent.empty() ? "every peer has arrived (NCCL's own set-up is stuck)"
                                           : rank_list(absent) + (absent.size() == 1 ? " has" : " have") +
                                                 " not joined (not started, or stuck before the group)";
    abort_group("creating the group: not complete after " + std::to_string(int(timeout_s_)) +
                    " s (--comm-timeout): " + who + ". Aborting the group.",
                1);
  });
  ncclComm_t c;
  const ncclResult_t init = ncclCommInitRank(&c, size_, id, rank_);
  {
    std::lock_guard<std::mutex> lock(m);
    created = true;
  }
  cv.notify_one();
  watchdog.join();
  EPMOE_NCCL_CHECK(init);
  comm_ = c;
  // Every download of results (the models' logits) waits through sync(): under the deadline.
  cuda::set_stream_wait([](void* g, const char* what) { static_cast<NcclGroup*>(g)->sync(what); }, this);
}

NcclGroup::~NcclGroup() {
  if (comm_) cuda::set_stream_wait(nullptr, nullptr);
  if (peer_fault_host_) cudaFreeHost(peer_fault_host_);
  if (!status_base_.empty()) std::remove((status_base_ + std::to_string(rank_) + ".status").c_str());
  if (comm_) ncclCommDestroy(nc(comm_));
}

void NcclGroup::abort_group(const std::string& message, int exit_code) {
  std::fprintf(stderr, "epmoe: rank %d: %s\n", rank_, message.c_str());
  std::fflush(stderr);
  if (comm_) ncclCommAbort(nc(comm_));
  std::_Exit(exit_code);
}

void NcclGroup::write_status(const char* what) const {
  const std::string path = status_base_ + std::to_string(rank_) + ".status", tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return;  // best effort: the diagnosis then calls this rank silent
  std::fprintf(f, "%llu %.3f %s\n", (unsigned long long)ops_, wall_seconds(), what);
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

std::string NcclGroup::diagnose_peers() const {
  const double now = wall_seconds();
  std::vector<PeerReport> peers;
  for (int p = 0; p < size_; p++) {
    if (p == rank_) continue;
    unsigned long long count = 0;
    double when = 0;
    char name[160] = {};
    bool fresh = false;
    if (FILE* f = std::fopen((status_base_ + std::to_string(p) + ".status").c_str(), "r")) {
      fresh = std::fscanf(f, "%llu %lf %159[^\n]", &count, &when, name) == 3 && now - when <= kStatusStale;
      std::fclose(f);
    }
    peers.push_back({p, fresh, uint64_t(count), name});
  }
  return peer_verdict(peers, ops_, "every peer is waiting");
}

void NcclGroup::sync(const char* what) {
  ops_++;
  test_fault_point(rank_, ops_, what);
  if (!comm_) {
    EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  auto next_status = start + kStatusAfter;
  IdleBackoff backoff(start);
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream());
    // A device-side wait gave up on a peer (device_peer_fault): it names the peer, whatever the
    // rest of the stream did after it.
    if (peer_fault_host_ && reinterpret_cast<volatile int32_t*>(peer_fault_host_)[0] != 0) {
      volatile int32_t* f = peer_fault_host_;
      abort_group(std::string(what) + " (operation " + std::to_string(ops_) + "): rank " + std::to_string(f[1]) +
                      " does not answer: its " + peer_fault_stage_name(f[2]) + " signal did not arrive over NVLink within " +
                      std::to_string(int(timeout_s_)) + " s (--comm-timeout; " + diagnose_peers() +
                      "). Aborting the group.",
                  1);
    }
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) EPMOE_CUDA_CHECK(e);
    ncclResult_t async;
    EPMOE_NCCL_CHECK(ncclCommGetAsyncError(nc(comm_), &async));
    if (async != ncclSuccess)
      abort_group(std::string("NCCL failed in ") + what + " (operation " + std::to_string(ops_) + "): " +
                      ncclGetErrorString(async) + ". Aborting the group.",
                  1);
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_status) {  // a long wait: say where this rank is, for a peer that times out
      write_status(what);
      next_status = now + kStatusEvery;
    }
    if (std::chrono::duration<double>(now - start).count() > timeout_s_)
      abort_group(std::string(what) + " (operation " + std::to_string(ops_) + "): no answer from the group for " +
                      std::to_string(int(timeout_s_)) + " s (--comm-timeout): " + diagnose_peers() +
                      ". Aborting the group.",
                  1);
    // An idle wait (set_idle_waits) naps between queries: NCCL progresses on the device whatever
    // the host does.
    if (!(idle_waits_ && backoff.nap(now))) std::this_thread::yield();
  }
}

int32_t* NcclGroup::device_peer_fault() {
  if (!peer_fault_host_) {
    void* h = nullptr;
    EPMOE_CUDA_CHECK(cudaHostAlloc(&h, 4 * sizeof(int32_t), cudaHostAllocMapped));
    std::memset(h, 0, 4 * sizeof(int32_t));
    void* d = nullptr;
    EPMOE_CUDA_CHECK(cudaHostGetDevicePointer(&d, h, 0));
    peer_fault_host_ = static_cast<int32_t*>(h);
    peer_fault_dev_ = static_cast<int32_t*>(d);
  }
  return peer_fault_dev_;
}

const char* NcclGroup::peer_fault_stage_name(int stage) {
  switch (stage) {
    case 1: return "dispatch";
    case 2: return "combine";
    default: return "exchange";
  }
}

struct NcclGroup::Buffers {
  cuda::DeviceArray<unsigned char> scratch;
  cuda::PinnedArray<unsigned char> staging;
};

unsigned char* NcclGroup::scratch(size_t bytes) {
  if (!buffers_) buffers_ = std::make_unique<Buffers>();
  buffers_->scratch.reserve(std::max<size_t>(bytes, 4096));
  return buffers_->scratch.data();
}

unsigned char* NcclGroup::staging(size_t bytes) {
  if (!buffers_) buffers_ = std::make_unique<Buffers>();
  buffers_->staging.reserve(std::max<size_t>(bytes, 4096));
  return buffers_->staging.data();
}

// Host values travel host -> page-locked staging -> device, through NCCL, and back the same way:
// the copy back is asynchronous, so that sync() and its deadline do the waiting.
void NcclGroup::allreduce_one(void* value, int op, int type, const char* what) {
  unsigned char* d = scratch(16);
  unsigned char* h = staging(16);
  std::memcpy(h, value, 8);
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(d, h, 8, cudaMemcpyHostToDevice, stream()));
  EPMOE_NCCL_CHECK(ncclAllReduce(d, d, 1, ncclDataType_t(type), ncclRedOp_t(op), nc(comm_), stream()));
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(h, d, 8, cudaMemcpyDeviceToHost, stream()));
  sync(what);
  std::memcpy(value, h, 8);
}

int64_t NcclGroup::allreduce_max(int64_t v) {
  if (size_ == 1) return v;
  allreduce_one(&v, ncclMax, ncclInt64, "allreduce_max");
  return v;
}

int64_t NcclGroup::allreduce_sum(int64_t v) {
  if (size_ == 1) return v;
  allreduce_one(&v, ncclSum, ncclInt64, "allreduce_sum");
  return v;
}

double NcclGroup::allreduce_max_f64(double v) {
  if (size_ == 1) return v;
  allreduce_one(&v, ncclMax, ncclFloat64, "allreduce_max_f64");
  return v;
}

double NcclGroup::allreduce_sum_f64(double v) {
  std::vector<double> all(static_cast<size_t>(size_));
  allgather(&v, sizeof v, all.data());
  double s = 0;
  for (double x : all) s += x;  // rank order: the same sum on every rank
  return s;
}

void NcclGroup::barrier() {
  if (size_ == 1) return;
  int64_t v = 0;
  allreduce_one(&v, ncclSum, ncclInt64, "barrier");
}

void NcclGroup::allgather(const void* send, size_t bytes, void* recv) {
  if (size_ == 1 || bytes == 0) {
    if (bytes) std::memcpy(recv, send, bytes);
    return;
  }
  const size_t total = bytes * size_t(size_), off = align16(bytes);
  unsigned char* d = scratch(off + total);
  unsigned char* h = staging(std::max(bytes, total));
  std::memcpy(h, send, bytes);
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream()));
  EPMOE_NCCL_CHECK(ncclAllGather(d, d + off, bytes, ncclChar, nc(comm_), stream()));
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(h, d + off, total, cudaMemcpyDeviceToHost, stream()));
  sync("allgather");
  std::memcpy(recv, h, total);
}

void NcclGroup::allgatherv(const void* send, size_t bytes, void* recv, const std::vector<size_t>& recv_bytes) {
  EPMOE_ASSERT(recv_bytes.size() == size_t(size_) && recv_bytes[size_t(rank_)] == bytes,
               "allgatherv: one count per rank, this rank's equal to its bytes");
  if (size_ == 1) {
    if (bytes) std::memcpy(recv, send, bytes);
    return;
  }
  const size_t most = *std::max_element(recv_bytes.begin(), recv_bytes.end());
  if (most == 0) return;
  const size_t total = most * size_t(size_), off = align16(most);
  unsigned char* d = scratch(off + total);
  unsigned char* h = staging(total);
  std::memcpy(h, send, bytes);  // padded to `most`: the padding is sent and never read
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(d, h, most, cudaMemcpyHostToDevice, stream()));
  EPMOE_NCCL_CHECK(ncclAllGather(d, d + off, most, ncclChar, nc(comm_), stream()));
  EPMOE_CUDA_CHECK(cudaMemcpyAsync(h, d + off, total, cudaMemcpyDeviceToHost, stream()));
  sync("allgatherv");
  unsigned char* out = static_cast<unsigned char*>(recv);
  for (int r = 0; r < size_; r++) {
    std::memcpy(out, h + size_t(r) * most, recv_bytes[size_t(r)]);
    out += recv_bytes[size_t(r)];
  }
}

}  // namespace epmoe
