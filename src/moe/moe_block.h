// The MoE block's data flow, written once for every device (docs/ARCHITECTURE.md, "Data flow of
// the MoE layer"); the CPU's phases are MoeLayer's (moe/moe_layer.cc), the GPU's GpuModel's
// (model/cuda/gpu_model.cu). This function orders them:
//
//   x[T, H] -> router logits -> top-k (logical ids, weights) -> a replica per (token, slot)
//           -> backend.run()   dispatch -> experts -> combine: FINAL for these tokens, reduced once
//           -> + the shared expert (gated where the family has a gate), on the home rank
//
// No phase knows which backend runs, none reduces across ranks, and the backend's output is only
// ever added to, never reduced again (the bug class of docs/ARCHITECTURE.md is impossible here
// because the one call to the backend is this one). tests/layering_test.sh fails a MoE block
// elsewhere: the model may not build the backend's input (MoeTokens).
#pragma once

#include "ep/backend.h"

namespace epmoe {

// Ops, one struct per device (a template, not virtual calls: the GPU's phases only enqueue kernels
// on its stream and a CUDA graph captures them), each phase with its one-line contract:
//   bool replaying();            the step's routing is given (routing replay, R3): no router runs
//   void replayed_route();       the given top-k ids and weights (checked) -> a replica per (token, slot)
//   void router_logits();        [T, E] logits = x . router^T with fp32 accuracy (top-k is sensitive to rounding)
//   void route();                logits -> the family's top-k ids and weights (moe/routing.h) -> a replica
//                                per (token, slot) (Placement::choose); captured when the step asks
//   MoeTokens tokens();          the rows, replicas and weights as the backend reads them
//   ExpertRunner& experts();     the routed experts this rank holds, on its device
//   float* routed();             where the backend writes the combined [T, H] output (fp32)
//   bool has_shared_expert();    the family has one and the call has tokens
//   void shared_expert();        SwiGLU_shared(x) and, where the family has one, its gate's logit
//   void output();               the block's output: routed + sigmoid(gate) * shared (or routed alone), into
//                                y (CPU), or those parts for the decoder to add into x (GPU: fused in its next norm)
template <class Ops>
void run_moe_block(Ops& ops, A2ABackend& backend) {
  if (ops.replaying()) {
    ops.replayed_route();
  } else {
    ops.router_logits();
    ops.route();
  }
  backend.run(ops.tokens(), ops.experts(), ops.routed());
  if (ops.has_shared_expert()) ops.shared_expert();
  ops.output();
}

}  // namespace epmoe
