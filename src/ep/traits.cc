#include "ep/traits.h"

namespace epmoe {

BackendTraits traits_of(BackendKind kind) {
  switch (kind) {
    case BackendKind::None:
      return {kind, "none",
              "all-gather of tokens and routing; each rank serves its experts for all tokens; per-slot results return home",
              "ncclAllGather of tokens and routing (padded to the largest rank); per-slot results return home with "
              "grouped ncclSend/ncclRecv"};
    case BackendKind::AllToAll:
      return {kind, "alltoall", "count exchange + MPI_Alltoallv; a token goes once to each rank owning one of its experts",
              "count exchange, then grouped ncclSend/ncclRecv; a token goes once to each rank owning one of its experts"};
    case BackendKind::LowLatency:
      return {kind, "lowlatency",
              "buffers of fixed capacity allocated once; one message per (token, expert); overflow in further rounds",
              "fixed-capacity buffers mapped with CUDA IPC, one record per (token, expert) written straight into the "
              "destination over NVLink; overflow in further rounds"};
    case BackendKind::OneSided:
      return {kind, "onesided",
              "MPI-3 RMA windows: slots reserved with MPI_Fetch_and_op, payload and results written with MPI_Put",
              "peers' buffers mapped with CUDA IPC: slots reserved with device atomics at the destination, records and "
              "answers written by kernels straight into peer memory over NVLink, per-source epoch flags; no NCCL on the "
              "hot path"};
    case BackendKind::Fused:
      return {kind, "fused",
              "token chunks pipelined with non-blocking all-to-alls: dispatch of chunk i+1 and combine of i-1 overlap "
              "experts of i",
              "token chunks pipelined over two streams with onesided's NVLink writes: dispatch of chunk i+1 and combine "
              "of i-1 (comm stream) overlap experts of i (compute stream)"};
  }
  return {kind, "?", "", ""};
}

std::vector<BackendKind> all_backend_kinds() {
  return {BackendKind::None, BackendKind::AllToAll, BackendKind::LowLatency, BackendKind::OneSided, BackendKind::Fused};
}

std::string_view mechanism_on(const BackendTraits& t, Device device) {
  switch (device) {
    case Device::Cpu: return t.cpu;
    case Device::Cuda: return t.cuda;
  }
  return {};
}

}  // namespace epmoe
