// Memory of every GPU of the group mapped into every process (CUDA IPC), for backends that write
// straight into a peer's buffer over NVLink instead of asking NCCL to move bytes: the GPU
// counterpart of an MPI-3 RMA window (src/ep/mpi/onesided.cc), the mechanism of DeepEP's intranode
// mode and of MoRI. All GPUs of one host; the group only carries the handles, once.
//
// One allocation per rank, the same layout on every rank (IpcLayout): a signal block (per-source
// flags holding the epoch of the last call a source finished writing, and reservation counters),
// then the regions a backend asks for. Completion is by epoch: every run() is one epoch; a source
// writes its payload, then (release, system scope) sets its flag at the destination to the epoch;
// the destination waits until every source's flag has reached it. Flags only grow, so nothing is
// reset between calls. A backend keeps two slots of regions (epoch e uses slot e & 1, so that one
// call can be dispatched while the previous one is combined) and writes a slot for epoch e + 2
// only after every owner said, by its flag of epoch e, that it has finished reading it.
//
// Every wait has a deadline (the group's --comm-timeout, measured on the GPU's clock). A wait that
// passes it writes {1, peer, stage} to the group's device_peer_fault() word and returns; the
// group's sync() then aborts naming the peer (comm/nccl_group.h). Later waits of the same process
// return at once once the word is set, so a dead peer costs one timeout, not one per layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ep/cuda/flag_wait.cuh"
#include "kernels/cuda/common.cuh"

namespace epmoe {
class Group;
}

namespace epmoe::cuda {

constexpr int kIpcMaxRanks = 16;

// The base of every rank's allocation, as this process sees it (peer[me] is its own).
struct IpcPeers {
  unsigned char* base[kIpcMaxRanks] = {};
};

// The signal block at the start of every allocation.
struct IpcSignals {
  uint64_t flag[2][kIpcMaxRanks];  // [stage][source]: the last epoch the source completed
  int32_t counter[2];              // reservation counters, one per slot
  int32_t pad[2];
  uint64_t epoch_now;              // this rank's epoch when the device keeps it (a call that a CUDA
                                   // graph replays cannot take its epoch from the host)
  uint64_t pad2;
};
static_assert(sizeof(IpcSignals) % 16 == 0, "regions after the signals stay 16-byte aligned");

// --- device side --------------------------------------------------------------------------------

// Sets this rank's flag of `stage` at every peer to `epoch`; call from one thread once every write
// of the payload is complete and fenced.
__device__ inline void ipc_signal_all(const IpcPeers& peers, int R, int me, int stage, uint64_t epoch) {
  __threadfence_system();
  for (int d = 0; d < R; d++)
    st_release_sys(&reinterpret_cast<IpcSignals*>(peers.base[d])->flag[stage][me], epoch);
}

// An epoch given by the host, or kept on the device (epoch_dev: IpcSignals::epoch_now of this rank;
// the call's dispatch advances it, the rest of the call reads it).
struct IpcEpoch {
  uint64_t value = 0;
  uint64_t* dev = nullptr;
  __device__ uint64_t get() const { return dev ? *reinterpret_cast<volatile uint64_t*>(dev) : value; }
};

// The "last block signals" pattern of a grid that writes a payload to peers: every block fences
// its writes and takes a ticket; the last one sets the flags (and rearms the ticket counter).
// advance: a device-kept epoch moves to the next one first (the dispatch of a call).
// Call from every thread of every block, after the block's writes.
__device__ inline void ipc_grid_done_signal(const IpcPeers& peers, int R, int me, int stage, IpcEpoch epoch,
                                            bool advance, unsigned* blocks_done) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    last = atomicAdd(blocks_done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    *blocks_done = 0;
    uint64_t e = epoch.get();
    if (advance && epoch.dev) *epoch.dev = ++e;
    ipc_signal_all(peers, R, me, stage, e);
  }
}

// --- host side ----------------------------------------------------------------------------------

// Byte offsets of the regions of one allocation (the same on every rank).
struct IpcLayout {
  std::vector<size_t> offsets;  // region i starts at offsets[i]
  size_t bytes = 0;
  explicit IpcLayout(const std::vector<size_t>& region_bytes) {
    size_t at = sizeof(IpcSignals);
    for (size_t b : region_bytes) {
      offsets.push_back(at);
      at += (b + 255) / 256 * 256;
    }
    bytes = at;
  }
};

class IpcWindow {
 public:
  // g: carries the handles and the barriers (in the runtime the NCCL group; any group of processes
  // on one host's GPUs will do). fault_word: the group's device_peer_fault() word, or any mapped
  // page-locked int32[4] the caller polls.
  IpcWindow(Group& g, int32_t* fault_word) : g_(g), fault_(fault_word) {}
  ~IpcWindow() { release(); }
  IpcWindow(const IpcWindow&) = delete;
  IpcWindow& operator=(const IpcWindow&) = delete;

  // Collective: every rank calls it with the same layout. Unmaps and frees the previous window
  // (after a barrier, so that no peer still maps it), allocates and zeroes this rank's, exchanges
  // the handles and maps every peer's. The epoch starts again at 0.
  void allocate(const IpcLayout& layout);
  bool allocated() const { return mine_ != nullptr; }
  const IpcLayout& layout() const { return layout_; }

  const IpcPeers& peers() const { return peers_; }
  unsigned char* mine() const { return mine_; }
  IpcSignals* my_signals() const { return reinterpret_cast<IpcSignals*>(mine_); }
  // The next epoch (one per call of the backend), kept by the host.
  uint64_t next_epoch() { return ++epoch_; }
  // This rank's epoch kept on the device instead (IpcSignals::epoch_now).
  uint64_t* device_epoch() const {
    return reinterpret_cast<uint64_t*>(mine_ + offsetof(IpcSignals, epoch_now));
  }
  // The word a wait writes a peer that does not signal in time into.
  int32_t* fault_word() const { return fault_; }
  // The wait deadline in ns, from the group's timeout.
  uint64_t timeout_ns() const;

 private:
  void release();
  Group& g_;
  IpcLayout layout_{{}};
  IpcPeers peers_;
  unsigned char* mine_ = nullptr;
  uint64_t epoch_ = 0;
  int32_t* fault_ = nullptr;
};

// What waiting for every source's flag of `stage` (0 dispatch, 1 combine) to reach `epoch` takes,
// for a kernel that waits in its prologue (flag_wait.cuh).
FlagWait ipc_flag_wait(const IpcWindow& w, int R, int stage, IpcEpoch epoch);

// Waits (one block, launched on the stream) until every source's flag of `stage` has reached
// `epoch`, with the window's deadline. stage: 0 dispatch, 1 combine (the fault word says stage + 1).
// Then, when count_out is given, copies min(counter[counter], cap) there (the rows a dispatch
// reserved in this rank) and clears it for the next use of the slot.
// counter: which reservation counter (the slot) count_out reads.
void ipc_wait(const IpcWindow& w, int R, int stage, IpcEpoch epoch, int counter, int32_t* count_out, int32_t cap,
              cudaStream_t s);

}  // namespace epmoe::cuda
