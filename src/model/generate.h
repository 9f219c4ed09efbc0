// Greedy generation for the sequences this rank serves, in lockstep with the other ranks: every
// rank runs every step (with no tokens once its own sequences are done) until no rank has work.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/mpi_group.h"
#include "model/model.h"

namespace epmoe {

struct GenerateRequest {
  uint64_t id = 0;  // index in the user's input
  std::vector<int32_t> prompt;
};

struct GenerateParams {
  int max_new_tokens = 16;
  std::vector<int> stop_ids;  // generation of a sequence ends after one of these (it is kept)
  ForwardOptions forward;
};

// Returns the new tokens of each request, in the order of `mine`. on_token(i, id) is called as
// each token of request i is chosen (for streaming).
std::vector<std::vector<int32_t>> generate_greedy(Model& model, A2ABackend& backend, MpiGroup& comm,
                                                  const std::vector<GenerateRequest>& mine, const GenerateParams& p,
                                                  const std::function<void(size_t, int32_t)>& on_token = {});

}  // namespace epmoe
