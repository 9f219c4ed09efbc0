// Backend traits as data, in one place (ARCHITECTURE.md). They feed the audit, the docs and the
// tests -- never the model: nothing outside src/ep/ may ask which backend runs.
#pragma once

#include <string_view>

#include "ep/backend.h"

namespace epmoe {

enum class BackendKind { None, AllToAll, LowLatency, OneSided, Fused };

enum class TokenLayout {
  Replicated,  // every rank sees every token (all-gather)
  Scattered,   // a token travels only to the ranks that serve it
};

enum class WeightsAppliedBy { HomeRank, ExpertRank };

struct BackendTraits {
  BackendKind kind;
  std::string_view name;
  std::string_view mechanism;
  TokenLayout layout;
  bool bounded_capacity;  // fixed buffers, overflow in further rounds (never dropped)
  bool dedup;             // a token goes once per destination rank, not once per slot
  bool pipelined;         // communication of one chunk overlaps compute of another
};

BackendTraits traits_of(BackendKind kind);
// The deterministic combine sums w_k * y_k at home; the fast combine lets the expert rank apply
// the weights and sum its own slots.
WeightsAppliedBy weights_applied_by(CombineMode mode);

}  // namespace epmoe
