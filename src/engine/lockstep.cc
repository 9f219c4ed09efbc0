#include "engine/lockstep.h"

#include "util/error.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

namespace epmoe {

std::vector<size_t> my_share(size_t n, const Group& group) {
  std::vector<size_t> out;
  for (size_t i = 0; i < n; i++)
    if (int(i % size_t(group.size())) == group.rank()) out.push_back(i);
  return out;
}

std::vector<Generation> generate(LanguageModel& model, A2ABackend& backend, Group& group,
                                 const std::vector<GenerateRequest>& mine, const GenerateParams& p,
                                 const std::function<void(size_t, int32_t)>& on_token) {
  Scheduler sched(model, backend, group, p);
  std::vector<size_t> first;  // index of each request's first result
  size_t results = 0;
  std::string refused;
  for (const GenerateRequest& r : mine) {
    GenerateRequest q = r;
    q.params = p;
    first.push_back(results);
    results += size_t(q.n);
    try {
      sched.submit(std::move(q));
    } catch (const InputError& e) {
      if (refused.empty()) refused = e.what();
    }
  }
  // Every rank stops, not only the one holding the request (the others would wait for it).
  if (group.any(!refused.empty()))
    throw InputError(refused.empty() ? "another rank refused a request (it says why)" : refused);
  if (on_token)
    sched.on_token = [&](size_t h, int j, int32_t t) { on_token(first[h] + size_t(j), t); };
  sched.run();
  std::vector<Generation> out;
  for (size_t h = 0; h < mine.size(); h++)
    for (const Generation& g : sched.results(h)) out.push_back(g);
  return out;
}

std::vector<std::vector<int32_t>> generate_greedy(LanguageModel& model, A2ABackend& backend, Group& group,
                                                  const std::vector<GenerateRequest>& mine, const GenerateParams& p,
                                                  const std::function<void(size_t, int32_t)>& on_token) {
  GenerateParams greedy = p;
  greedy.sampling = {};
  std::vector<std::vector<int32_t>> out;
  for (auto& g : generate(model, backend, group, mine, greedy, on_token)) out.push_back(std::move(g.tokens));
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

namespace {

// Every rank's int32 words, concatenated in rank order, on every rank.
std::vector<int32_t> allgather_words(Group& group, const std::vector<int32_t>& packed) {
  const int R = group.size();
  const std::vector<int64_t> sizes = group.allgather_i64(int64_t(packed.size()));
  std::vector<size_t> bytes(static_cast<size_t>(R));
  size_t all = 0;
  for (int r = 0; r < R; r++) all += (bytes[size_t(r)] = size_t(sizes[size_t(r)]) * sizeof(int32_t));
  std::vector<int32_t> recv(all / sizeof(int32_t));
  group.allgatherv(packed.data(), packed.size() * sizeof(int32_t), recv.data(), bytes);
  return recv;
}

int32_t bits_of(float v) {
  int32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
float float_of(int32_t b) {
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

}  // namespace

std::vector<Generation> gather_generations(Group& group, size_t total, const std::vector<uint64_t>& ids,
                                           const std::vector<Generation>& outs) {
  // Packed as [id, n, finish, has_logprobs, top_n, cached_tokens, tokens[n], logprob bits[n]?, (id, bits)[n * top_n]]:
  // log-probs travel as their bits, so every rank prints what the sampling rank computed.
  std::vector<int32_t> packed;
  EPMOE_ASSERT(ids.size() == outs.size(), "gather_generations: one id per generation");
  for (size_t i = 0; i < outs.size(); i++) {
    const Generation& g = outs[i];
    const int32_t top_n = g.top.empty() ? 0 : int32_t(g.top[0].size());
    packed.insert(packed.end(), {int32_t(ids[i]), int32_t(g.tokens.size()), int32_t(g.finish),
                                 int32_t(!g.logprobs.empty()), top_n, int32_t(g.cached_tokens)});
    packed.insert(packed.end(), g.tokens.begin(), g.tokens.end());
    for (float v : g.logprobs) packed.push_back(bits_of(v));
    for (auto& step : g.top)
      for (auto& [id, lp] : step) packed.insert(packed.end(), {id, bits_of(lp)});
  }
  const std::vector<int32_t> recv = allgather_words(group, packed);
  std::vector<Generation> res(total);
  for (size_t i = 0; i < recv.size();) {
    const size_t id = size_t(recv[i]), n = size_t(recv[i + 1]);
    const bool has_lp = recv[i + 3] != 0;
    const size_t top_n = size_t(recv[i + 4]);
    Generation& g = res[id];
    g.finish = FinishReason(recv[i + 2]);
    g.cached_tokens = recv[i + 5];
    i += 6;
    g.tokens.assign(recv.begin() + long(i), recv.begin() + long(i + n));
    i += n;
    if (has_lp) {
      for (size_t k = 0; k < n; k++) g.logprobs.push_back(float_of(recv[i + k]));
      i += n;
    }
    if (top_n > 0) {
      g.top.resize(n);
      for (size_t k = 0; k < n; k++)
        for (size_t q = 0; q < top_n; q++, i += 2) g.top[k].push_back({recv[i], float_of(recv[i + 1])});
    }
  }
  return res;
}

}  // namespace epmoe
