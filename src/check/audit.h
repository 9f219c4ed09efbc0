// The reduction audit: the backend runs with probe experts (expert e returns (e + 1) * x) on
// random tokens and routing, and every rank checks that its final output is
//   y_t = x_t * sum_k w_k (e_k + 1),
// computed locally in the same slot order. It needs no expert weights, so it works for a model
// of any size, and when the answer is wrong it says which way: the output reduced twice, not
// reduced, a replica counted twice, a slot lost, rows of another token, or wrong weights.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/group.h"
#include "ep/backend.h"
#include "ep/placement.h"
#include "tensor/device.h"

namespace epmoe {

struct AuditOptions {
  int H = 64;
  int K = 2;
  int64_t tokens_per_rank = 40;  // rank r holds tokens_per_rank + 3r (the last of >= 3 ranks: 0)
  uint64_t seed = 7;
  bool exact = true;  // deterministic combine: bit-identical to the local formula; fast: ~1e-6
};

// The audit every command runs (`--audit`, `epmoe check`): the model's hidden size and top-k, and
// tokens_per_rank = max_dispatch_tokens_per_rank + 5 so that a bounded-capacity backend needs
// a second round; under a bound on a call's tokens (bo.max_tokens_per_rank > 0) the audit keeps to
// it too, since rank r audits tokens_per_rank + 3r tokens. Exact under the deterministic combine.
// InputError when the bound leaves the last of `ranks` ranks no token (it names --max-batch-tokens,
// the flag that sets the bound).
AuditOptions make_audit_options(int hidden_size, int top_k, const BackendOptions& bo, int ranks);

struct AuditResult {
  bool pass = false;
  std::string verdict;                    // "ok" or what went wrong, with token counts
  std::map<std::string, int64_t> counts;  // tokens per diagnosis, over all ranks
  int64_t tokens = 0;                     // over all ranks
  double max_rel_error = 0;               // over all ranks
};

// Collective: every rank of the group calls it with the same options. The tokens live on
// `device` (the backend's), the probe experts run there (check/probe.h), and the bits a correct
// backend must reproduce come from the single-process path on the same device with every expert
// local: the same kernels, the same slot-order combine.
AuditResult run_audit(Group& group, Device device, const Placement& placement, A2ABackend& backend,
                      const AuditOptions& opt);

// This rank's random tokens and routing: x [T, H], logical/physical/w [T, K].
struct AuditTokens {
  int64_t T = 0;
  int H = 0, K = 0;
  std::vector<float> x, w;
  std::vector<int32_t> logical, physical;
};
AuditTokens make_audit_tokens(const Placement& placement, int rank, int ranks, const AuditOptions& opt);

// What probe expert `physical` does to its rows: multiplies them by this.
float audit_probe_scale(const Placement& placement, int physical);

}  // namespace epmoe
