// `epmoe score --model DIR --ids 1,2,3 --out FILE`: the logits at every position of the ids,
// as transformers' model(input_ids).logits[0], written as safetensors (tensor `logits`, F32).
// Under mpirun (or on several GPUs) the sequence runs on rank 0; the other ranks serve their
// experts with T = 0.
#include <cstdio>
#include <limits>
#include <memory>

#include "cli/commands.h"
#include "engine/lockstep.h"
#include "engine/sampling.h"
#include "io/json_util.h"
#include "io/safetensors.h"
#include "util/error.h"

namespace epmoe {

int run_score(const ScoreOptions& o) {
  std::vector<int32_t> ids = parse_ids(o.ids, "--ids");
  check_prompt(ids, load_model_config(o.run.model_dir), "--ids", 0);
  Runtime rt = start_runtime(o.run);
  const bool mine = rt.group->rank() == 0;
  std::vector<uint64_t> seq_ids;
  std::vector<std::vector<int32_t>> seqs;
  if (mine) {
    seq_ids.push_back(0);
    seqs.push_back(ids);
  }
  auto logits = score_sequences(*rt.model, *rt.backend, seq_ids, seqs, rt.options.forward);
  if (mine) {
    const int64_t V = rt.cfg.vocab_size;
    // The log-prob of each token given the ones before it: the numbers `generate --logprobs`
    // reports for the same sequence at the same temperature, bit for bit.
    std::vector<float> token_lp(ids.size(), std::numeric_limits<float>::quiet_NaN());
    for (size_t t = 1; t < ids.size(); t++)
      token_lp[t] = token_logprob(logits[0].data() + (t - 1) * size_t(V), V, o.temperature, ids[t]);
    write_safetensors(o.out, {{"logits", DType::F32, {int64_t(ids.size()), V}, logits[0].data()},
                              {"token_logprobs", DType::F32, {int64_t(ids.size())}, token_lp.data()}},
                      {{"model", o.run.model_dir},
                       {"ids", join_ids(ids)},
                       {"device", device_name(rt.device)},
                       {"compute", rt.options.compute},
                       {"lm_head", rt.options.lm_head},
                       {"temperature", json_float(o.temperature).dump()}});
    std::fprintf(stderr, "epmoe score: %zu positions x %lld logits -> %s (%s, %s%s, %d rank%s)\n", ids.size(),
                 (long long)V, o.out.c_str(), device_name(rt.device), rt.options.compute.c_str(),
                 rt.options.lm_head == "int8" ? ", int8 lm_head" : "", rt.group->size(), rt.group->size() > 1 ? "s" : "");
  }
  return 0;
}

}  // namespace epmoe
