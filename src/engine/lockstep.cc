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

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
  }
  return "?";
}

std::vector<Generation> generate(LanguageModel& model, A2ABackend& backend, Group& group,
                                 const std::vector<GenerateRequest>& mine, const GenerateParams& p,
                                 const std::function<void(size_t, int32_t)>& on_token) {
  const int64_t V = model.config().vocab_size;
  // Greedy without log-probs needs no logits on the host: the model may pick on its device.
  const bool pick_on_device = p.sampling.temperature <= 0.0f && !p.logprobs && p.top_logprobs == 0;
  const int64_t budget = p.max_batch_tokens > 0 ? p.max_batch_tokens : INT64_MAX;
  const size_t max_running = p.max_running_requests > 0 ? size_t(p.max_running_requests) : SIZE_MAX;
  enum class State { Queued, Running, Done };
  std::vector<State> state(mine.size(), State::Queued);
  std::vector<Sequence> seqs(mine.size());
  std::vector<size_t> fed(mine.size(), 0);        // prompt tokens in the cache (or in this step)
  std::vector<int32_t> pending(mine.size(), -1);  // the last chosen token, fed by the next step
  std::vector<Generation> out(mine.size());
  std::vector<size_t> running;  // in admission order: decode tokens first, then prefill chunks
  size_t next_queued = 0;
  for (auto& r : mine) EPMOE_ASSERT(!r.prompt.empty(), "generate: request " + std::to_string(r.id) + " has no prompt");
  if (p.max_new_tokens <= 0) next_queued = mine.size();  // nothing to generate: nobody is admitted

  for (;;) {
    // One step of this rank's scheduler: every running sequence's decode token first, then prefill
    // chunks (the running sequences' first, then newly admitted requests) up to the token budget.
    std::vector<Sequence*> active;
    std::vector<std::vector<int32_t>> tokens;
    std::vector<size_t> index;
    int64_t room = budget;
    for (size_t i : running)
      if (pending[i] >= 0 && room > 0) {
        active.push_back(&seqs[i]);
        tokens.push_back({pending[i]});
        index.push_back(i);
        room--;
      }
    auto prefill = [&](size_t i) {
      const size_t n = std::min<size_t>(mine[i].prompt.size() - fed[i], size_t(room));
      active.push_back(&seqs[i]);
      tokens.emplace_back(mine[i].prompt.begin() + long(fed[i]), mine[i].prompt.begin() + long(fed[i] + n));
      index.push_back(i);
      fed[i] += n;
      room -= int64_t(n);
    };
    for (size_t i : running)
      if (pending[i] < 0 && fed[i] < mine[i].prompt.size() && room > 0) prefill(i);
    while (room > 0 && next_queued < mine.size() && running.size() < max_running) {
      const size_t i = next_queued++;
      state[i] = State::Running;
      seqs[i] = model.new_sequence(mine[i].id);
      running.push_back(i);
      prefill(i);
    }
    // Lockstep: a rank without work still runs the step (T = 0) while any rank has work.
    if (!group.any(!active.empty())) break;
    std::vector<int32_t> next;
    std::vector<std::vector<float>> logits;
    if (pick_on_device) next = model.forward_greedy(active, tokens, backend, p.forward);
    else logits = model.forward(active, tokens, backend, /*all_logits=*/false, p.forward);
    for (size_t a = 0; a < active.size(); a++) {
      const size_t i = index[a];
      if (fed[i] < mine[i].prompt.size()) continue;  // a prefill chunk that does not end the prompt
      Generation& g = out[i];
      int32_t t;
      if (pick_on_device) {
        t = next[a];
      } else {
        // The new token's absolute position: the sequence's length after this step's tokens.
        const float* row = logits[a].data();
        t = sample_token(row, V, p.sampling, mine[i].seed, active[a]->len);
        if (p.logprobs || p.top_logprobs > 0) {
          const RowLogprobs lp(row, V, p.sampling.temperature);
          if (p.logprobs) g.logprobs.push_back(lp.at(t));
          if (p.top_logprobs > 0) g.top.push_back(lp.top(p.top_logprobs));
        }
      }
      g.tokens.push_back(t);
      if (on_token) on_token(i, t);
      pending[i] = t;
      const bool stop = std::find(p.stop_ids.begin(), p.stop_ids.end(), t) != p.stop_ids.end();
      if (stop) g.finish = FinishReason::Stop;
      if (stop || int(g.tokens.size()) >= p.max_new_tokens) {
        state[i] = State::Done;
        seqs[i] = Sequence{};  // its KV cache goes back now, not at the end
      }
    }
    running.erase(std::remove_if(running.begin(), running.end(), [&](size_t i) { return state[i] == State::Done; }),
                  running.end());
  }
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

std::vector<Generation> gather_generations(Group& group, size_t total, const std::vector<GenerateRequest>& mine,
                                           const std::vector<Generation>& outs) {
  // Packed as [id, n, finish, has_logprobs, top_n, tokens[n], logprob bits[n]?, (id, bits)[n * top_n]]:
  // log-probs travel as their bits, so every rank prints what the sampling rank computed.
  std::vector<int32_t> packed;
  for (size_t i = 0; i < mine.size(); i++) {
    const Generation& g = outs[i];
    const int32_t top_n = g.top.empty() ? 0 : int32_t(g.top[0].size());
    packed.insert(packed.end(), {int32_t(mine[i].id), int32_t(g.tokens.size()), int32_t(g.finish),
                                 int32_t(!g.logprobs.empty()), top_n});
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
    i += 5;
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
