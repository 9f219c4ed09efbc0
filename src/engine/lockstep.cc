#include "engine/lockstep.h"

#include <algorithm>

namespace epmoe {

std::vector<size_t> my_share(size_t n, const Group& group) {
  std::vector<size_t> out;
  for (size_t i = 0; i < n; i++)
    if (int(i % size_t(group.size())) == group.rank()) out.push_back(i);
  return out;
}

std::vector<std::vector<int32_t>> generate_greedy(LanguageModel& model, A2ABackend& backend, Group& group,
                                                  const std::vector<GenerateRequest>& mine, const GenerateParams& p,
                                                  const std::function<void(size_t, int32_t)>& on_token) {
  std::vector<Sequence> seqs;
  for (auto& r : mine) seqs.push_back(model.new_sequence(r.id));
  std::vector<std::vector<int32_t>> out(mine.size());
  std::vector<bool> done(mine.size(), p.max_new_tokens <= 0);
  // Step 0 feeds the prompts (prefill); later steps feed the last chosen token.
  std::vector<std::vector<int32_t>> feed(mine.size());
  for (size_t i = 0; i < mine.size(); i++) feed[i] = mine[i].prompt;

  for (;;) {
    std::vector<Sequence*> active;
    std::vector<std::vector<int32_t>> tokens;
    std::vector<size_t> index;
    for (size_t i = 0; i < mine.size(); i++)
      if (!done[i] && !feed[i].empty()) {
        active.push_back(&seqs[i]);
        tokens.push_back(feed[i]);
        index.push_back(i);
      }
    // Lockstep: a rank without work still runs the step (T = 0) while any rank has work.
    if (!group.any(!active.empty())) break;
    const std::vector<int32_t> next = model.forward_greedy(active, tokens, backend, p.forward);
    for (size_t a = 0; a < active.size(); a++) {
      const size_t i = index[a];
      out[i].push_back(next[a]);
      if (on_token) on_token(i, next[a]);
      feed[i] = {next[a]};
      const bool stop = std::find(p.stop_ids.begin(), p.stop_ids.end(), next[a]) != p.stop_ids.end();
      if (stop || int(out[i].size()) >= p.max_new_tokens) done[i] = true;
    }
  }
  return out;
}

std::vector<std::vector<float>> score_sequences(LanguageModel& model, A2ABackend& backend,
                                                const std::vector<uint64_t>& ids,
                                                const std::vector<std::vector<int32_t>>& seqs,
                                                const ForwardOptions& fo) {
  std::vector<Sequence> s;
  for (uint64_t id : ids) s.push_back(model.new_sequence(id));
  std::vector<Sequence*> ptrs;
  for (auto& x : s) ptrs.push_back(&x);
  return model.forward(ptrs, seqs, backend, /*all_logits=*/true, fo);
}

std::vector<std::vector<int32_t>> gather_results(Group& group, size_t total, const std::vector<GenerateRequest>& mine,
                                                 const std::vector<std::vector<int32_t>>& outs) {
  // Packed as [id, n, tokens...] records.
  std::vector<int32_t> packed;
  for (size_t i = 0; i < mine.size(); i++) {
    packed.push_back(int32_t(mine[i].id));
    packed.push_back(int32_t(outs[i].size()));
    packed.insert(packed.end(), outs[i].begin(), outs[i].end());
  }
  const int R = group.size();
  const std::vector<int64_t> sizes = group.allgather_i64(int64_t(packed.size()));
  std::vector<size_t> bytes(static_cast<size_t>(R));
  size_t all = 0;
  for (int r = 0; r < R; r++) all += (bytes[size_t(r)] = size_t(sizes[size_t(r)]) * sizeof(int32_t));
  std::vector<int32_t> recv(all / sizeof(int32_t));
  group.allgatherv(packed.data(), packed.size() * sizeof(int32_t), recv.data(), bytes);
  std::vector<std::vector<int32_t>> res(total);
  for (size_t i = 0; i < recv.size();) {
    const size_t id = size_t(recv[i]), n = size_t(recv[i + 1]);
    res[id].assign(recv.begin() + long(i) + 2, recv.begin() + long(i + 2 + n));
    i += 2 + n;
  }
  return res;
}

}  // namespace epmoe
