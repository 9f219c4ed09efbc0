#include "ep/traits.h"

namespace epmoe {

BackendTraits traits_of(BackendKind kind) {
  switch (kind) {
    case BackendKind::None:
      return {kind, "none", "all-gather of tokens and routing; each rank serves its experts for all tokens; per-slot results return home",
              TokenLayout::Replicated, false, true, false};
    case BackendKind::AllToAll:
      return {kind, "alltoall", "count exchange + MPI_Alltoallv; a token goes once to each rank owning one of its experts",
              TokenLayout::Scattered, false, true, false};
    case BackendKind::LowLatency:
      return {kind, "lowlatency", "buffers of fixed capacity allocated once; one message per (token, expert); overflow in further rounds",
              TokenLayout::Scattered, true, false, false};
    case BackendKind::OneSided:
      return {kind, "onesided", "MPI-3 RMA windows: slots reserved with MPI_Fetch_and_op, payload and results written with MPI_Put",
              TokenLayout::Scattered, false, true, false};
    case BackendKind::Fused:
      return {kind, "fused", "token chunks pipelined with non-blocking all-to-alls: dispatch of chunk i+1 and combine of i-1 overlap experts of i",
              TokenLayout::Scattered, false, true, true};
  }
  return {kind, "?", "?", TokenLayout::Scattered, false, false, false};
}

WeightsAppliedBy weights_applied_by(CombineMode mode) {
  switch (mode) {
    case CombineMode::Deterministic: return WeightsAppliedBy::HomeRank;
    case CombineMode::Fast: return WeightsAppliedBy::ExpertRank;
  }
  return WeightsAppliedBy::HomeRank;
}

}  // namespace epmoe
