#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <climits>

#include "util/error.h"
#include "util/threads.h"

namespace epmoe {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
  }
  return "?";
}

Scheduler::Scheduler(LanguageModel& model, A2ABackend& backend, Group& group, const SchedulerOptions& opt)
    : model_(model), backend_(backend), group_(group), opt_(opt) {}

size_t Scheduler::submit(GenerateRequest r) {
  const std::string what = "request " + std::to_string(r.id);
  if (r.prompt.empty()) throw InputError(what + ": empty prompt");
  if (r.n < 1) throw InputError(what + ": n = " + std::to_string(r.n) + " (at least one sample)");
  if (r.params.max_new_tokens < 0) throw InputError(what + ": max_new_tokens < 0");
  validate(r.params.sampling);
  validate(r.params.processing, model_.config().vocab_size);
  for (int32_t id : r.params.logprob_ids)
    if (id < 0 || id >= model_.config().vocab_size)
      throw InputError(what + ": token_ids_logprob: token " + std::to_string(id) + " is outside the vocabulary");
  if (r.params.sampling_mask && r.params.sampling.temperature > 0.0f &&
      !(r.params.sampling.top_k > 0 && r.params.sampling.top_k <= kMaxSamplingMaskIds))
    throw InputError(what + ": return_sampling_mask with temperature > 0 needs top_k in 1.." +
                     std::to_string(kMaxSamplingMaskIds) + " (without it the support can be the whole vocabulary)");
  if (r.params.prior_output < 0 || size_t(r.params.prior_output) > r.prompt.size())
    throw InputError(what + ": prior_output " + std::to_string(r.params.prior_output) + " outside the prompt");
  // The blocks the request may need in an empty pool (admit's promise without a cached prefix).
  KvPool& pool = model_.kv_pool();
  const int64_t P = int64_t(r.prompt.size()), M = r.params.max_new_tokens, B = pool.block_tokens();
  const int64_t worst = P + std::max<int64_t>(M, 1) - 1;  // the last token chosen is never fed
  Entry e;
  e.fork_blocks = pool.blocks_for(worst) - P / B;
  const int64_t cow = r.n > 1 && P % B != 0 ? 1 : 0;  // sample 0 copies the shared partial block
  const int64_t total = pool.blocks_for(worst) + cow + int64_t(r.n - 1) * e.fork_blocks;
  if (total > pool.total_blocks())
    throw InputError(what + ": " + std::to_string(P) + " prompt tokens + " + std::to_string(M) + " new tokens x " +
                     std::to_string(r.n) + " samples need " + std::to_string(total) + " KV blocks of " +
                     std::to_string(B) + " tokens; the pool has " + std::to_string(pool.total_blocks()) +
                     " (raise --kv-cache-tokens to at least " + std::to_string(total * B) + ")");
  e.req = std::move(r);
  e.out.resize(size_t(e.req.n));
  // Nothing to generate and nothing to score: done without a step.
  if (e.req.params.max_new_tokens == 0 && e.req.params.input_logprobs_from < 0) e.state = State::Done;
  entries_.push_back(std::move(e));
  return entries_.size() - 1;
}

void Scheduler::abort(size_t h) {
  EPMOE_ASSERT(h < entries_.size(), "scheduler: no request " + std::to_string(h));
  if (in_step_) {  // from on_token: the step still reads this request's samples
    aborted_.push_back(h);
    return;
  }
  Entry& e = entries_[h];
  if (e.state == State::Done) return;
  for (size_t j = 0; j < e.out.size(); j++) {
    const bool open = j >= e.samples.size() || !e.samples[j].done;
    if (open) e.out[j].finish = FinishReason::Abort;
  }
  e.samples.clear();  // the blocks and promises go back now
  e.state = State::Done;
  running_.erase(std::remove(running_.begin(), running_.end(), h), running_.end());
}

void Scheduler::stop_sample(size_t h, int j) {
  EPMOE_ASSERT(h < entries_.size() && j >= 0 && size_t(j) < entries_[h].out.size(),
               "scheduler: no sample " + std::to_string(j) + " of request " + std::to_string(h));
  Entry& e = entries_[h];
  if (e.state != State::Running || size_t(j) >= e.samples.size()) return;  // ended, or it has no token yet
  Sample& s = e.samples[size_t(j)];
  if (in_step_) {
    s.stop_now = true;
    return;
  }
  if (s.done || e.out[size_t(j)].tokens.empty()) return;
  e.out[size_t(j)].finish = FinishReason::Stop;
  s.done = true;
  s.pending = -1;
  s.seq = Sequence{};  // its own blocks go back at once
  finish_if_done(e);
  if (e.state == State::Done) running_.erase(std::remove(running_.begin(), running_.end(), h), running_.end());
}

void Scheduler::forget(size_t h) {
  EPMOE_ASSERT(h < entries_.size() && entries_[h].state == State::Done,
               "scheduler: forget of request " + std::to_string(h) + ", which is not finished");
  Entry& e = entries_[h];
  e.req.prompt = {};
  e.req.params.stop_ids = {};
  e.out = {};
  e.samples = {};
}

bool Scheduler::has_work() const {
  if (!running_.empty()) return true;
  for (size_t h = next_queued_; h < entries_.size(); h++)
    if (entries_[h].state == State::Queued) return true;
  return false;
}

bool Scheduler::finished(size_t h) const { return entries_[h].state == State::Done; }

const std::vector<Generation>& Scheduler::results(size_t h) const { return entries_[h].out; }

size_t Scheduler::queued() const {
  size_t n = 0;
  for (size_t h = next_queued_; h < entries_.size(); h++) n += entries_[h].state == State::Queued;
  return n;
}

size_t Scheduler::running_sequences() const {
  size_t n = 0;
  for (size_t h : running_) n += size_t(entries_[h].req.n);
  return n;
}

bool Scheduler::admit(size_t h) {
  Entry& e = entries_[h];
  KvPool& pool = model_.kv_pool();
  const int64_t P = int64_t(e.req.prompt.size()), B = pool.block_tokens();
  const int64_t worst = P + std::max(e.req.params.max_new_tokens, 1) - 1;
  const int64_t cow = e.req.n > 1 && P % B != 0 ? 1 : 0;
  // At least the prompt's last token is computed: its logits choose the first token; and every
  // position whose logits give a prompt log-prob asked for.
  int64_t match = opt_.prefix_cache && !e.req.params.routed_experts ? P - 1 : 0;  // (routing: every token runs)
  if (e.req.params.input_logprobs_from >= 0)
    match = std::min<int64_t>(match, std::max(e.req.params.input_logprobs_from, 1) - 1);
  auto kv = pool.admit(e.req.prompt, match, worst, cow + int64_t(e.req.n - 1) * e.fork_blocks);
  if (!kv) return false;
  Sample s;
  s.seq = Sequence{e.req.id, kv->tokens(), kv};
  e.fed = size_t(kv->tokens());
  for (auto& g : e.out) g.cached_tokens = kv->tokens();
  e.samples.push_back(std::move(s));
  e.state = State::Running;
  running_.push_back(h);
  return true;
}

void Scheduler::finish_if_done(Entry& e) {
  for (auto& s : e.samples)
    if (!s.done) return;
  if (int(e.samples.size()) < e.req.n) return;
  e.samples.clear();  // the KV blocks go back now, not when the scheduler ends
  e.state = State::Done;
}

void Scheduler::choose(size_t h, int j, int32_t t, float logprob, std::vector<std::pair<int32_t, float>> top) {
  Entry& e = entries_[h];
  Sample& s = e.samples[size_t(j)];
  Generation& g = e.out[size_t(j)];
  const RequestParams& p = e.req.params;
  g.tokens.push_back(t);
  if (p.logprobs) g.logprobs.push_back(logprob);
  if (p.top_logprobs > 0) g.top.push_back(std::move(top));
  if (on_token) on_token(h, j, t);
  s.pending = t;
  const bool stop = s.stop_now || std::find(p.stop_ids.begin(), p.stop_ids.end(), t) != p.stop_ids.end();
  if (stop) g.finish = FinishReason::Stop;
  if (stop || int(g.tokens.size()) >= p.max_new_tokens) {
    s.done = true;
    s.seq = Sequence{};  // its own blocks go back at once
  }
}

// What one step feeds and what it will choose: built by plan(), read by forward() and apply().
struct Scheduler::StepPlan {
  // A choice this step will make: a sample's token from its row (for a prompt that is in now,
  // each of its n samples from the same row).
  struct Pick {
    Pick(size_t h_, int j_, size_t row_, int64_t pos_) : h(h_), j(j_), row(row_), position(pos_) {}
    size_t h;
    int j;
    size_t row;
    int64_t position;  // of the drawn token: the sequence's length after this step's tokens
    int32_t token = -1;
    float logprob = 0;
    std::vector<std::pair<int32_t, float>> top;
    std::vector<float> ids;  // logprob_ids' log-probs
    std::vector<int32_t> mask;  // sampling_mask: the draw's support
  };
  std::vector<Sequence*> active;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::pair<size_t, int>> who;  // (handle, sample) of each active sequence
  std::vector<int64_t> chunk_start;         // position of each active sequence's first new token
  int64_t decode = 0, prefill_fed = 0;
  std::vector<Pick> picks_todo;
  std::vector<size_t> scored_only;  // requests with max_new_tokens 0 whose prompt is in now
  bool host_logits = false, device_draws = false;
  bool all_logits = false;        // prompt log-probs need the logits of every position of their chunks
  bool capture_routing = false;   // a request in the step records its routing (routing replay)
};

// What the forward gave: tokens picked on the device (greedy), or logits rows, and the routing.
struct Scheduler::StepOutput {
  std::vector<int32_t> picks;
  std::vector<std::vector<float>> logits;
  StepRouting routing;
  bool captured = false;  // the forward captured the step's routing
};

Scheduler::StepPlan Scheduler::plan() {
  StepPlan sp;
  std::vector<Sequence*>& active = sp.active;
  std::vector<std::vector<int32_t>>& tokens = sp.tokens;
  std::vector<std::pair<size_t, int>>& who = sp.who;
  std::vector<int64_t>& chunk_start = sp.chunk_start;
  const int64_t budget = opt_.max_batch_tokens > 0 ? opt_.max_batch_tokens : INT64_MAX;
  const size_t max_running = opt_.max_running_requests > 0 ? size_t(opt_.max_running_requests) : SIZE_MAX;
  int64_t room = budget;
  // 1. decode tokens
  for (size_t h : running_)
    for (size_t j = 0; j < entries_[h].samples.size() && room > 0; j++) {
      Sample& s = entries_[h].samples[j];
      if (s.done || s.pending < 0) continue;
      active.push_back(&s.seq);
      tokens.push_back({s.pending});
      who.push_back({h, int(j)});
      chunk_start.push_back(s.seq.len);
      s.pending = -1;
      room--;
      sp.decode++;
    }
  // 2. and 3. prefill chunks
  auto prefill = [&](size_t h) {
    Entry& e = entries_[h];
    const size_t n = std::min<size_t>(e.req.prompt.size() - e.fed, size_t(room));
    active.push_back(&e.samples[0].seq);
    tokens.emplace_back(e.req.prompt.begin() + long(e.fed), e.req.prompt.begin() + long(e.fed + n));
    who.push_back({h, 0});
    chunk_start.push_back(int64_t(e.fed));
    e.fed += n;
    room -= int64_t(n);
    sp.prefill_fed += int64_t(n);
  };
  for (size_t h : running_)
    if (room > 0 && entries_[h].fed < entries_[h].req.prompt.size()) prefill(h);
  size_t in_flight = running_sequences();
  while (room > 0 && next_queued_ < entries_.size()) {
    Entry& e = entries_[next_queued_];
    if (e.state != State::Queued) {  // aborted while queued, or nothing to generate
      next_queued_++;
      continue;
    }
    if (in_flight + size_t(e.req.n) > max_running && in_flight > 0) break;
    if (!admit(next_queued_)) break;  // waits for blocks, in arrival order
    in_flight += size_t(e.req.n);
    prefill(next_queued_++);
  }

  // The choices this step will make, and where they are made (host or device).
  sp.device_draws = model_.draws_on_device() && !opt_.forward.check_numerics;
  for (size_t a = 0; a < active.size(); a++) {
    const Entry& e = entries_[who[a].first];
    sp.all_logits |= e.req.params.input_logprobs_from >= 0 && chunk_start[a] < int64_t(e.req.prompt.size());
  }
  sp.host_logits |= sp.all_logits;
  for (size_t a = 0; a < active.size(); a++) {
    const auto [h, j] = who[a];
    const Entry& e = entries_[h];
    if (e.fed < e.req.prompt.size()) continue;  // a prefill chunk that does not end the prompt
    if (e.req.params.max_new_tokens == 0) {     // scored, nothing to draw
      if (chunk_start[a] < int64_t(e.req.prompt.size())) sp.scored_only.push_back(h);
      continue;
    }
    const int64_t pos = active[a]->len + int64_t(tokens[a].size());
    if (int(e.samples.size()) < e.req.n) {
      for (int k = 0; k < e.req.n; k++) sp.picks_todo.emplace_back(h, k, a, pos);
    } else {
      sp.picks_todo.emplace_back(h, j, a, pos);
    }
    const RequestParams& p = e.req.params;
    sp.host_logits |= p.sampling.temperature > 0.0f || p.logprobs || p.top_logprobs > 0 || p.processing.active() ||
                      !p.logprob_ids.empty() || p.sampling_mask;
    // The device draws what needs no sorted order and no history: no masks, no penalties; a
    // top-N of the row (logprobs: N) up to kMaxDrawTopN.
    const SamplingParams& s = p.sampling;
    sp.device_draws &= s.top_k <= 0 && s.top_p >= 1.0f && s.min_p <= 0.0f && p.top_logprobs <= kMaxDrawTopN &&
                       !p.processing.active() && p.logprob_ids.empty() && !p.sampling_mask;
  }
  sp.device_draws &= sp.host_logits && !sp.all_logits;
  // Routing replay: the step's routing is captured when a request in it records its own.
  for (size_t a = 0; a < active.size() && !opt_.forward.capture && !sp.capture_routing; a++)
    if (entries_[who[a].first].req.params.routed_experts) sp.capture_routing = true;
  return sp;
}

Scheduler::StepOutput Scheduler::forward(StepPlan& sp) {
  StepOutput out;
  ForwardOptions fo = opt_.forward;
  if (sp.capture_routing) fo.capture = &out.routing;
  out.captured = fo.capture != nullptr;
  const auto f0 = std::chrono::steady_clock::now();
  // One model step; what each row wants: the device's draws, logits for the host, or (greedy
  // without log-probs) the argmax, picked on the device where the model can.
  const size_t n = sp.active.size();
  StepBatch batch{sp.active, sp.tokens, {}, {}, fo};
  if (sp.device_draws) {
    batch.want.assign(n, StepWant::Nothing);
    for (const StepPlan::Pick& pk : sp.picks_todo) {
      const Entry& e = entries_[pk.h];
      const RequestParams& p = e.req.params;
      batch.want[pk.row] = StepWant::Draw;
      batch.draws.push_back({int(pk.row), p.sampling.temperature, e.req.seed + uint64_t(pk.j), pk.position,
                             std::max(p.top_logprobs, 0)});
    }
  } else {
    batch.want.assign(n, sp.host_logits ? (sp.all_logits ? StepWant::AllLogits : StepWant::Logits) : StepWant::Argmax);
  }
  StepResult r = model_.step(batch, backend_);
  if (sp.device_draws) {
    for (size_t i = 0; i < sp.picks_todo.size(); i++) {
      sp.picks_todo[i].token = r.drawn[i].token;
      sp.picks_todo[i].logprob = r.drawn[i].logprob;
      sp.picks_todo[i].top = std::move(r.drawn[i].top);  // (RowLogprobs::top's: empty without top_logprobs)
    }
  } else if (sp.host_logits) {
    out.logits = std::move(r.logits);
  } else {
    out.picks = std::move(r.argmax);
  }
  stats_.forward_seconds += seconds_since(f0);
  return out;
}

// Each recording request's tokens' routing: a prompt chunk's to every sample.
void Scheduler::record_routing(const StepPlan& sp, const StepRouting& routing) {
  const std::vector<std::vector<int32_t>>& tokens = sp.tokens;
  const std::vector<std::pair<size_t, int>>& who = sp.who;
  const std::vector<int64_t>& chunk_start = sp.chunk_start;
  const size_t per = size_t(routing.moe_layers) * size_t(routing.K);
  size_t t0 = 0;
  for (size_t a = 0; a < sp.active.size(); a++) {
    const auto [h, j] = who[a];
    Entry& e = entries_[h];
    const size_t n = tokens[a].size();
    if (e.req.params.routed_experts) {
      auto add = [&](Generation& g) {
        g.routed_experts.insert(g.routed_experts.end(), routing.ids.begin() + long(t0 * per),
                                routing.ids.begin() + long((t0 + n) * per));
        g.routed_weights.insert(g.routed_weights.end(), routing.weights.begin() + long(t0 * per),
                                routing.weights.begin() + long((t0 + n) * per));
      };
      if (chunk_start[a] < int64_t(e.req.prompt.size())) {
        for (Generation& g : e.out) add(g);
      } else {
        add(e.out[size_t(j)]);
      }
    }
    t0 += n;
  }
}

// Prompt log-probs: row i of a prefill chunk (its token at position q) gives prompt[q + 1].
void Scheduler::record_prompt_logprobs(const StepPlan& sp, const std::vector<std::vector<float>>& logits) {
  const std::vector<std::vector<int32_t>>& tokens = sp.tokens;
  const std::vector<std::pair<size_t, int>>& who = sp.who;
  const std::vector<int64_t>& chunk_start = sp.chunk_start;
  const int64_t V = model_.config().vocab_size;
  std::vector<std::pair<size_t, size_t>> jobs;  // (active index, chunk row)
  for (size_t a = 0; a < sp.active.size(); a++) {
    Entry& e = entries_[who[a].first];
    const int64_t from = e.req.params.input_logprobs_from, P = int64_t(e.req.prompt.size());
    if (from < 0 || chunk_start[a] >= P) continue;
    for (size_t i = 0; i < tokens[a].size(); i++) {
      const int64_t next = chunk_start[a] + int64_t(i) + 1;
      if (next < P && next >= std::max<int64_t>(from, 1)) jobs.push_back({a, i});
    }
  }
  std::vector<float> lp(jobs.size());
  std::vector<std::vector<std::pair<int32_t, float>>> top(jobs.size());
  std::vector<std::vector<float>> ids(jobs.size());
  parallel_for(int64_t(jobs.size()), 1, [&](int64_t b, int64_t e_) {
    for (int64_t k = b; k < e_; k++) {
      const auto [a, i] = jobs[size_t(k)];
      const Entry& e = entries_[who[a].first];
      const RequestParams& p = e.req.params;
      const int32_t next = e.req.prompt[size_t(chunk_start[a] + int64_t(i) + 1)];
      const RowLogprobs row(logits[a].data() + int64_t(i) * V, V, p.sampling.temperature);
      lp[size_t(k)] = row.at(next);
      if (p.top_logprobs > 0) top[size_t(k)] = row.top(p.top_logprobs);
      for (int32_t id : p.logprob_ids) ids[size_t(k)].push_back(row.at(id));
    }
  });
  for (size_t k = 0; k < jobs.size(); k++) {  // in chunk order, and chunks come in prompt order
    Entry& e = entries_[who[jobs[k].first].first];
    for (Generation& g : e.out) {
      g.input_logprobs.push_back(lp[k]);
      if (e.req.params.top_logprobs > 0) g.input_top.push_back(top[k]);
      if (!e.req.params.logprob_ids.empty()) g.input_ids_logprobs.push_back(ids[k]);
    }
  }
}

void Scheduler::apply(StepPlan& sp, StepOutput& out) {
  const std::vector<std::vector<int32_t>>& tokens = sp.tokens;
  const std::vector<std::vector<float>>& logits = out.logits;
  const bool all_logits = sp.all_logits;
  if (out.captured) record_routing(sp, out.routing);
  in_step_ = true;

  // Forks: the n samples of a prompt that is now in share its blocks (sample 0's cache, before
  // any sample writes a token of its own).
  for (const StepPlan::Pick& pk : sp.picks_todo) {
    Entry& e = entries_[pk.h];
    if (pk.j != 0 || int(e.samples.size()) >= e.req.n) continue;
    for (int k = 1; k < e.req.n; k++) {
      Sample s;
      s.seq = Sequence{e.req.id + uint64_t(k), e.samples[0].seq.len,
                       model_.kv_pool().fork(*e.samples[0].seq.kv, e.fork_blocks)};
      e.samples.push_back(std::move(s));
    }
  }
  const int64_t V = model_.config().vocab_size;
  // The logits row a sequence's last new token left (all_logits: one row per new token).
  auto last_row = [&](size_t a) {
    return logits[a].data() + (all_logits ? int64_t(tokens[a].size() - 1) * V : 0);
  };
  if (all_logits) record_prompt_logprobs(sp, logits);
  // Every pick's token (and log-probs) from its row, unless the forward drew it already.
  parallel_for(int64_t(sp.picks_todo.size()), 1, [&](int64_t b, int64_t e_) {
    for (int64_t i = b; i < e_; i++) {
      StepPlan::Pick& pk = sp.picks_todo[size_t(i)];
      const Entry& e = entries_[pk.h];
      const RequestParams& p = e.req.params;
      if (sp.device_draws) continue;  // drawn with the forward
      if (!sp.host_logits) {
        pk.token = out.picks[pk.row];
        continue;
      }
      const float* row = last_row(pk.row);
      if (p.processing.active()) {  // the draw sees the processed row; the log-probs the model's
        std::vector<float> seen(row, row + V);
        process_logits(seen.data(), V, p.processing, e.req.prompt, p.prior_output, e.out[size_t(pk.j)].tokens,
                       p.stop_ids);
        pk.token = sample_token(seen.data(), V, p.sampling, e.req.seed + uint64_t(pk.j), pk.position,
                                p.sampling_mask ? &pk.mask : nullptr);
      } else {
        pk.token = sample_token(row, V, p.sampling, e.req.seed + uint64_t(pk.j), pk.position,
                                p.sampling_mask ? &pk.mask : nullptr);
      }
      if (p.logprobs || p.top_logprobs > 0 || !p.logprob_ids.empty()) {
        const RowLogprobs lp(row, V, p.sampling.temperature);
        pk.logprob = lp.at(pk.token);
        if (p.top_logprobs > 0) pk.top = lp.top(p.top_logprobs);
        for (int32_t id : p.logprob_ids) pk.ids.push_back(lp.at(id));
      }
    }
  });
  // In pick order: the tokens are chosen (on_token), stops and finishes recorded.
  for (StepPlan::Pick& pk : sp.picks_todo) {
    if (!entries_[pk.h].req.params.logprob_ids.empty())
      entries_[pk.h].out[size_t(pk.j)].ids_logprobs.push_back(std::move(pk.ids));
    if (entries_[pk.h].req.params.sampling_mask)
      entries_[pk.h].out[size_t(pk.j)].sampling_mask.push_back(std::move(pk.mask));
    choose(pk.h, pk.j, pk.token, pk.logprob, std::move(pk.top));
    finish_if_done(entries_[pk.h]);
  }
  for (size_t h : sp.scored_only) {
    Entry& e = entries_[h];
    e.samples.clear();
    e.state = State::Done;  // finish stays Length: max_new_tokens (0) reached
  }
  in_step_ = false;
  for (size_t h : aborted_) abort(h);  // asked for by on_token during the step
  aborted_.clear();
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [&](size_t h) { return entries_[h].state == State::Done; }),
                 running_.end());
}

bool Scheduler::step() {
  const auto t0 = std::chrono::steady_clock::now();
  StepPlan sp = plan();
  // Lockstep: a rank without work still runs the step (T = 0) while any rank has work.
  if (!group_.any(!sp.active.empty())) return false;
  StepOutput out = forward(sp);
  apply(sp, out);
  stats_.steps++;
  stats_.decode_tokens += sp.decode;
  stats_.prefill_tokens += sp.prefill_fed;
  stats_.step_seconds += seconds_since(t0);
  return true;
}

void Scheduler::run() {
  while (step()) {
  }
}

}  // namespace epmoe
