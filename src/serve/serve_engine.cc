#include "serve/serve_engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <tuple>

#include "comm/group.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/json_util.h"
#include "util/error.h"

namespace epmoe {

using nlohmann::json;

// A request as an order to the rank that runs it (msgpack of these fields: the floats travel as
// their exact values). Every field of GenerateRequest and its parts is listed once here: a field
// added to one of them is added to its list, or the serving rank would not see it.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SamplingParams, temperature, top_k, top_p, min_p)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(LogitProcessing, logit_bias, frequency_penalty, presence_penalty,
                                   repetition_penalty, min_new_tokens)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RequestParams, max_new_tokens, stop_ids, sampling, logprobs, top_logprobs,
                                   input_logprobs_from, logprob_ids, routed_experts, sampling_mask, processing,
                                   prior_output)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GenerateRequest, id, prompt, seed, n, params)

namespace {

// Characters (code points) of UTF-8 text: OpenAI's text_offset counts characters, as Python does.
int64_t utf8_chars(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// The longest prefix of s[0, end) that ends on a character boundary.
size_t utf8_floor(const std::string& s, size_t end) {
  while (end > 0 && end < s.size() && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) end--;
  return end;
}

// config.json minus what says nothing about the architecture (who wrote it, with what).
nlohmann::json architecture_of(const std::string& dir) {
  nlohmann::json j = read_json_file(dir + "/config.json");
  for (const char* k : {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache"}) j.erase(k);
  return j;
}

std::string shape_text(const TensorView& t) {
  std::string s = std::string(dtype_name(t.dtype)) + "[";
  for (size_t i = 0; i < t.shape.size(); i++) s += (i ? "," : "") + std::to_string(t.shape[i]);
  return s + "]";
}

}  // namespace

namespace {

// Numbers travel between ranks as their bytes (msgpack binary): log-probs and routing weights
// keep their bits, and a long prompt or a routing record is one copy, not one JSON number each.
template <class T>
json blob(const std::vector<T>& v) {
  std::vector<std::uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return json::binary(std::move(b));
}
template <class T>
std::vector<T> unblob(const json& j) {
  const auto& b = j.get_binary();
  EPMOE_ASSERT(b.size() % sizeof(T) == 0, "serve: a vector of " + std::to_string(b.size()) + " bytes between ranks");
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// [[ids, log-probs], ...] per position: top-N lists.
json tops_json(const std::vector<std::vector<std::pair<int32_t, float>>>& tops) {
  json out = json::array();
  for (const auto& step : tops) {
    std::vector<int32_t> ids;
    std::vector<float> lps;
    for (const auto& [id, lp] : step) ids.push_back(id), lps.push_back(lp);
    out.push_back({blob(ids), blob(lps)});
  }
  return out;
}
std::vector<std::vector<std::pair<int32_t, float>>> tops_of(const json& a) {
  std::vector<std::vector<std::pair<int32_t, float>>> out;
  for (const json& step : a) {
    const std::vector<int32_t> ids = unblob<int32_t>(step.at(0));
    const std::vector<float> lps = unblob<float>(step.at(1));
    std::vector<std::pair<int32_t, float>> s;
    for (size_t i = 0; i < ids.size(); i++) s.push_back({ids[i], lps[i]});
    out.push_back(std::move(s));
  }
  return out;
}
template <class T>
json rows_json(const std::vector<std::vector<T>>& rows) {
  json out = json::array();
  for (const auto& r : rows) out.push_back(blob(r));
  return out;
}
template <class T>
std::vector<std::vector<T>> rows_of(const json& a) {
  std::vector<std::vector<T>> out;
  for (const json& r : a) out.push_back(unblob<T>(r));
  return out;
}

json generations_json(const std::vector<Generation>& gs) {
  json a = json::array();
  for (const Generation& g : gs) {
    a.push_back({{"tokens", blob(g.tokens)},
                 {"logprobs", blob(g.logprobs)},
                 {"top", tops_json(g.top)},
                 {"input_top", tops_json(g.input_top)},
                 {"ids_logprobs", rows_json(g.ids_logprobs)},
                 {"input_ids_logprobs", rows_json(g.input_ids_logprobs)},
                 {"finish", int(g.finish)},
                 {"cached", g.cached_tokens},
                 {"input_logprobs", blob(g.input_logprobs)},
                 {"routed_experts", blob(g.routed_experts)},
                 {"routed_weights", blob(g.routed_weights)},
                 {"sampling_mask", rows_json(g.sampling_mask)}});
  }
  return a;
}
std::vector<Generation> generations_of(const json& a) {
  std::vector<Generation> out;
  for (const json& j : a) {
    Generation g;
    g.tokens = unblob<int32_t>(j.at("tokens"));
    g.logprobs = unblob<float>(j.at("logprobs"));
    g.top = tops_of(j.at("top"));
    g.input_top = tops_of(j.at("input_top"));
    g.ids_logprobs = rows_of<float>(j.at("ids_logprobs"));
    g.input_ids_logprobs = rows_of<float>(j.at("input_ids_logprobs"));
    g.finish = FinishReason(j.at("finish").get<int>());
    g.cached_tokens = j.at("cached").get<int64_t>();
    g.input_logprobs = unblob<float>(j.at("input_logprobs"));
    g.routed_experts = unblob<int32_t>(j.at("routed_experts"));
    g.routed_weights = unblob<float>(j.at("routed_weights"));
    g.sampling_mask = rows_of<int32_t>(j.at("sampling_mask"));
    out.push_back(std::move(g));
  }
  return out;
}

std::string to_bytes(const json& j) {
  const std::vector<std::uint8_t> b = json::to_msgpack(j);
  return std::string(b.begin(), b.end());
}

}  // namespace

ServeEngine::ServeEngine(Runtime& rt, const Tokenizer* tok, ServeEngineOptions opt)
    : rt_(rt), tok_(tok), opt_(std::move(opt)), weight_version_(opt_.weight_version), model_path_(rt.options.model_dir) {
  make_scheduler();
  const size_t R = size_t(rt_.group->size());
  rank_sequences_.assign(R, 0);
  // Until each rank's first report: its pool as this rank's (every rank sizes it alike), so that
  // /get_server_info has the KV figures from the start.
  const KvPool& pool = rt_.model->kv_pool();
  RankLoad empty;
  empty.kv_blocks_total = pool.total_blocks();
  rank_load_.assign(R, empty);
  report_ = json::object();
  refresh_metrics();
}

ServeEngine::~ServeEngine() = default;

void ServeEngine::make_scheduler() {
  sched_ = std::make_unique<Scheduler>(*rt_.model, *rt_.backend, *rt_.group, opt_.scheduler);
  // Each token chosen goes into this turn's report, with its log-prob and top-N when asked.
  sched_->on_token = [this](size_t h, int j, int32_t t) {
    const Generation& g = sched_->results(h)[size_t(j)];
    json ev = {key_of_.at(h), j, t, nullptr, nullptr, nullptr, nullptr};
    if (!g.logprobs.empty()) ev[3] = g.logprobs.back();
    if (!g.ids_logprobs.empty()) ev[5] = blob(g.ids_logprobs.back());
    if (!g.sampling_mask.empty()) ev[6] = blob(g.sampling_mask.back());
    if (!g.top.empty()) {
      json top = json::array();
      for (const auto& [id, lp] : g.top.back()) top.push_back({id, lp});
      ev[4] = std::move(top);
    }
    report_["tok"].push_back(std::move(ev));
  };
}

// ---------------------------------------------------------------- HTTP threads

void ServeEngine::submit(const JobPtr& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) {
      inbox_.push_back(job);
      wake_.notify_all();
      return;
    }
  }
  reject(job, "the server is shutting down", 503);
}

void ServeEngine::reject(const JobPtr& job, const std::string& why, int status) {
  {
    std::lock_guard<std::mutex> lock(job->mu);
    job->state = Job::State::Rejected;
    job->error = why;
    job->error_status = status;
    job->version++;
  }
  job->cv.notify_all();
}

ControlReply ServeEngine::call(Control c) {
  auto reply = std::make_shared<std::promise<ControlReply>>();
  auto fut = reply->get_future();
  c.reply = reply;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return {false, "the server is shutting down"};
    controls_.push_back(std::move(c));
  }
  wake_.notify_all();
  return fut.get();
}

void ServeEngine::abort(const std::string& rid) { call({Control::Kind::Abort, rid, "", nullptr, nullptr}); }
void ServeEngine::abort_all() { call({Control::Kind::AbortAll, "", "", nullptr, nullptr}); }
void ServeEngine::abort_job(const JobPtr& job) { call({Control::Kind::AbortJob, "", "", job, nullptr}); }
ControlReply ServeEngine::flush_cache() { return call({Control::Kind::Flush, "", "", nullptr, nullptr}); }
ControlReply ServeEngine::pause(const std::string& mode) { return call({Control::Kind::Pause, mode, "", nullptr, nullptr}); }
ControlReply ServeEngine::resume() { return call({Control::Kind::Resume, "", "", nullptr, nullptr}); }
ControlReply ServeEngine::update_weights(const std::string& path, const std::string& version) {
  return call({Control::Kind::Update, path, version, nullptr, nullptr});
}

ControlReply ServeEngine::update_weights_from_bytes(std::string bucket, bool commit, const std::string& version) {
  Control c{Control::Kind::Tensors, std::move(bucket), version, nullptr, nullptr};
  c.commit = commit;
  return call(std::move(c));
}

ServeMetrics ServeEngine::metrics() {
  std::lock_guard<std::mutex> lock(mu_);
  ServeMetrics m = metrics_;
  m.waiting += int64_t(inbox_.size());
  if (!m.ranks.empty()) m.ranks[0].waiting += int64_t(inbox_.size());
  return m;
}

std::string ServeEngine::weight_version() {
  std::lock_guard<std::mutex> lock(mu_);
  return weight_version_;
}

std::string ServeEngine::model_path() {
  std::lock_guard<std::mutex> lock(mu_);
  return model_path_;
}

// ---------------------------------------------------------------- rank 0's engine thread

void ServeEngine::take_inbox() {
  std::deque<JobPtr> jobs;
  std::deque<Control> controls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs.swap(inbox_);
    controls.swap(controls_);
  }
  for (auto& j : jobs) {
    if (!j->req.internal) {
      std::lock_guard<std::mutex> lock(mu_);
      metrics_.requests_received++;
    }
    if (paused_ || pending_update_) {
      held_.push_back(j);
    } else {
      admit_job(j);
    }
  }
  for (auto& c : controls) apply(c);
}

void ServeEngine::admit_job(const JobPtr& job) {
  Live L;
  L.req.id = uint64_t(next_request_id_);  // global: the same sequence ids whichever rank runs it
  next_request_id_ += job->req.n;
  L.req.prompt = job->req.prompt;
  L.req.seed = job->req.seed;
  L.req.n = job->req.n;
  L.req.params = job->req.params;
  L.job = job;
  L.text = std::make_shared<JobText>();
  L.text->raw.resize(size_t(job->req.n));
  if (tok_)
    for (int j = 0; j < job->req.n; j++)
      L.text->decoders.push_back(std::make_unique<StreamDecoder>(*tok_, job->req.skip_special_tokens));
  place(std::move(L));
}

uint64_t ServeEngine::place(Live L) {
  L.rank = least_loaded_rank();
  L.accepted = false;
  rank_sequences_[size_t(L.rank)] += L.req.n;
  rank_load_[size_t(L.rank)].requests++;
  const uint64_t key = next_key_++;
  live_.emplace(key, std::move(L));
  orders_.submit.push_back(key);
  return key;
}

// Fewest sequences in flight (rank 0 counts them as it places and retires pieces, so a burst of
// arrivals spreads at once), then fewest KV blocks in use, then fewest requests given so far (a
// lightly loaded server still spreads its requests), then the lowest rank.
int ServeEngine::least_loaded_rank() const {
  if (!opt_.dp_attention) return 0;
  int best = 0;
  auto load = [&](int r) {
    const RankLoad& l = rank_load_[size_t(r)];
    return std::make_tuple(rank_sequences_[size_t(r)], l.kv_blocks_used, l.requests);
  };
  for (int r = 1; r < int(rank_sequences_.size()); r++)
    if (load(r) < load(best)) best = r;
  return best;
}

std::string ServeEngine::encode_orders() {
  if (orders_.empty()) return "";
  json sub = json::array(), abort = json::array(), stop = json::array();
  for (uint64_t key : orders_.submit) {
    const auto it = live_.find(key);
    if (it != live_.end()) sub.push_back({it->second.rank, key, json(it->second.req)});
  }
  for (uint64_t key : orders_.abort) abort.push_back(key);
  for (const auto& [key, j] : orders_.stop) stop.push_back({key, j});
  const json o = {{"submit", std::move(sub)}, {"abort", std::move(abort)}, {"stop", std::move(stop)},
                  {"retract", orders_.retract}, {"flush", orders_.flush}};
  orders_ = Orders{};
  return to_bytes(o);
}

void ServeEngine::take_reports(const std::vector<std::string>& reports) {
  for (size_t r = 0; r < reports.size(); r++) {
    const json rep = json::from_msgpack(reports[r]);
    const json& ld = rep.at("load");
    RankLoad& l = rank_load_[r];
    l.waiting = ld.at(0), l.running = ld.at(1), l.kv_blocks_total = ld.at(2), l.kv_blocks_used = ld.at(3);
    l.kv_blocks_cached = ld.at(4), l.steps = ld.at(5);
    if (rep.contains("acc"))
      for (const json& k : rep["acc"]) on_accepted(k.get<uint64_t>());
    if (rep.contains("ref"))
      for (const json& e : rep["ref"]) on_refused(e.at(0).get<uint64_t>(), e.at(1).get<std::string>());
    if (rep.contains("tok"))
      for (const json& ev : rep["tok"]) {
        float lp = 0;
        if (!ev.at(3).is_null()) lp = ev.at(3).get<float>();
        std::vector<std::pair<int32_t, float>> top;
        if (!ev.at(4).is_null())
          for (const json& t : ev.at(4)) top.push_back({t.at(0).get<int32_t>(), t.at(1).get<float>()});
        std::vector<float> ids;
        if (!ev.at(5).is_null()) ids = unblob<float>(ev.at(5));
        std::vector<int32_t> mask;
        if (!ev.at(6).is_null()) mask = unblob<int32_t>(ev.at(6));
        on_token(ev.at(0).get<uint64_t>(), ev.at(1).get<int>(), ev.at(2).get<int32_t>(),
                 ev.at(3).is_null() ? nullptr : &lp, std::move(top), std::move(ids), std::move(mask));
      }
    if (rep.contains("fin"))
      for (const json& e : rep["fin"]) finish_piece_of(e.at(0).get<uint64_t>(), generations_of(e.at(1)));
    if (rep.contains("ret"))
      for (const json& e : rep["ret"]) retracted_piece(e.at(0).get<uint64_t>(), generations_of(e.at(1)));
    if (rep.contains("flushed")) flushed_ += rep["flushed"].get<int64_t>();
  }
  reply_deferred();
}

void ServeEngine::on_accepted(uint64_t key) {
  Live& L = live_.at(key);
  L.accepted = true;
  if (L.sample_of >= 0) return;  // a continuation: its job was accepted long ago
  const JobPtr& job = L.job;
  {
    std::lock_guard<std::mutex> lock(job->mu);
    job->state = Job::State::Accepted;
    job->samples.resize(size_t(job->req.n));
    job->weight_version = weight_version_;
    job->version++;
  }
  job->cv.notify_all();
  if (!job->req.internal) {
    std::lock_guard<std::mutex> lock(mu_);
    metrics_.prompt_tokens += int64_t(job->req.prompt.size());
  }
}

void ServeEngine::on_refused(uint64_t key, const std::string& why) {
  auto it = live_.find(key);
  if (it == live_.end()) return;
  Live L = std::move(it->second);
  live_.erase(it);
  rank_sequences_[size_t(L.rank)] -= L.req.n;
  if (L.sample_of >= 0) {  // a continuation that fitted before (a smaller pool after an update may not)
    abort_retracted(L);
    return;
  }
  reject(L.job, why, 400);
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.requests_rejected++;
}

void ServeEngine::on_token(uint64_t key, int j, int32_t t, const float* logprob,
                           std::vector<std::pair<int32_t, float>> top, std::vector<float> ids,
                           std::vector<int32_t> mask) {
  auto it = live_.find(key);
  if (it == live_.end()) return;
  Live& L = it->second;
  Job& job = *L.job;
  const ServeRequest& r = job.req;
  const int js = L.job_sample(j);  // the job's sample this piece's sample j is
  bool stop = false;
  {
    std::lock_guard<std::mutex> lock(job.mu);
    SampleProgress& sp = job.samples[size_t(js)];
    sp.tokens.push_back(t);
    if (r.params.logprobs && logprob) sp.logprobs.push_back(*logprob);
    if (r.params.top_logprobs > 0) sp.top.push_back(std::move(top));
    if (!r.params.logprob_ids.empty()) sp.ids_logprobs.push_back(std::move(ids));
    if (r.params.sampling_mask) sp.sampling_mask.push_back(std::move(mask));
    if (tok_) {
      std::string& raw = L.text->raw[size_t(js)];
      sp.text_offset.push_back(utf8_chars(raw));
      const std::string piece = L.text->decoders[size_t(js)]->push(t);
      const size_t before = raw.size();
      raw += piece;
      // A stop string ends the sample at its first occurrence; only the new text can start one.
      size_t hit = std::string::npos, hit_len = 0;
      for (const std::string& s : r.stop_strings) {
        const size_t from = before >= s.size() ? before - s.size() + 1 : 0;
        const size_t p = raw.find(s, from);
        if (p != std::string::npos && p < hit) {
          hit = p;
          hit_len = s.size();
          sp.matched_stop = s;
        }
      }
      if (hit != std::string::npos) {
        sp.text = raw.substr(0, hit + (r.no_stop_trim ? hit_len : 0));
        stop = true;
      } else {
        // Text that could still become a stop string is held back until it cannot.
        size_t hold = 0;
        for (const std::string& s : r.stop_strings) hold = std::max(hold, s.size() - 1);
        const size_t end = utf8_floor(raw, raw.size() > hold ? raw.size() - hold : 0);
        if (end > sp.text.size()) sp.text = raw.substr(0, end);
      }
    }
    job.version++;
  }
  job.cv.notify_all();
  // Ordered before the next step runs: the sample gets no token after this one.
  if (stop) orders_.stop.push_back({key, j});
  if (!r.internal) {
    std::lock_guard<std::mutex> lock(mu_);
    metrics_.generation_tokens++;
  }
}

void ServeEngine::finish_piece_of(uint64_t key, const std::vector<Generation>& res) {
  auto it = live_.find(key);
  if (it == live_.end()) return;
  Live L = std::move(it->second);
  live_.erase(it);
  rank_sequences_[size_t(L.rank)] -= L.req.n;
  Job& job = *L.job;
  {
    std::lock_guard<std::mutex> lock(job.mu);
    if (job.samples.size() < size_t(job.req.n)) job.samples.resize(size_t(job.req.n));
    for (size_t j = 0; j < res.size(); j++) {
      const int js = L.job_sample(int(j));
      record_sample(job.samples[size_t(js)], res[j], L.text.get(), js);
    }
    if (!res.empty() && L.sample_of < 0) {  // (a continuation computed no prompt log-probs)
      job.input_logprobs = res[0].input_logprobs;
      job.input_top = res[0].input_top;
      job.input_ids_logprobs = res[0].input_ids_logprobs;
      job.cached_tokens = res[0].cached_tokens;
    }
    job.version++;
  }
  job.cv.notify_all();
  finish_piece(L.text, L.job);
}

// A sample's end as its rank reports it (the caller holds the job's mutex): finish reason (Stop
// where rank 0 matched a stop string, even on the sample's last allowed token), the stop id that
// matched, the text with what the decoder held back, the routed experts.
void ServeEngine::record_sample(SampleProgress& sp, const Generation& g, JobText* text, int js) const {
  sp.finish = sp.matched_stop.empty() ? g.finish : FinishReason::Stop;
  if (sp.finish == FinishReason::Stop && sp.matched_stop.empty() && !sp.tokens.empty()) sp.matched_id = sp.tokens.back();
  if (tok_ && text && sp.matched_stop.empty())
    sp.text = text->raw[size_t(js)] + text->decoders[size_t(js)]->flush();
  sp.routed_experts = g.routed_experts;
  sp.routed_weights = g.routed_weights;
  sp.done = true;
}

// A retracted continuation that will not run: its sample ends with abort.
void ServeEngine::abort_retracted(const Live& c) {
  {
    std::lock_guard<std::mutex> lock(c.job->mu);
    SampleProgress& sp = c.job->samples[size_t(c.sample_of)];
    sp.finish = FinishReason::Abort;
    sp.done = true;
  }
  finish_piece(c.text, c.job);
}

// One piece (or retracted continuation) of a job has ended; with the last one the job is done.
void ServeEngine::finish_piece(const std::shared_ptr<JobText>& text, const JobPtr& jp) {
  if (text && --text->pieces > 0) return;
  Job& job = *jp;
  bool aborted = false;
  {
    std::lock_guard<std::mutex> lock(job.mu);
    for (auto& sp : job.samples) aborted |= sp.finish == FinishReason::Abort;
    job.e2e_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - job.start).count();
    job.state = Job::State::Done;
    job.version++;
  }
  job.cv.notify_all();
  if (!job.req.internal) {
    std::lock_guard<std::mutex> lock(mu_);
    (aborted ? metrics_.requests_aborted : metrics_.requests_finished)++;
    metrics_.cached_tokens += job.cached_tokens;
  }
}

// Pause with mode retract: every request leaves its rank's scheduler (its KV blocks back to the
// pool); here is what one had generated. One that has not generated yet waits as a new arrival;
// each unfinished sample of the others waits as a continuation -- its prompt followed by its
// tokens so far, the tokens it has left, its own seed (seed + j) and sequence id (id + j) -- which
// recomputes that prefix and draws on at the same positions: the same tokens and log-prob bits as
// a run never paused.
void ServeEngine::retracted_piece(uint64_t key, const std::vector<Generation>& res) {
  auto it = live_.find(key);
  if (it == live_.end()) return;
  Live L = std::move(it->second);
  live_.erase(it);
  rank_sequences_[size_t(L.rank)] -= L.req.n;
  bool started = false;
  for (const Generation& g : res) started |= !g.tokens.empty();
  if (L.sample_of < 0 && !started) {
    held_.push_front(L.job);
    requeued_++;
    return;
  }
  int continued = 0;
  for (size_t j = 0; j < res.size(); j++) {
    const Generation& g = res[j];
    const int js = L.job_sample(int(j));
    bool stopped = false;
    {
      std::lock_guard<std::mutex> lock(L.job->mu);
      stopped = !L.job->samples[size_t(js)].matched_stop.empty();
    }
    const bool done = stopped || g.finish == FinishReason::Stop || g.finish == FinishReason::Abort ||
                      int(g.tokens.size()) >= L.req.params.max_new_tokens;
    if (done) {  // its result, as finish_piece_of records it
      std::lock_guard<std::mutex> lock(L.job->mu);
      record_sample(L.job->samples[size_t(js)], g, L.text.get(), js);
      continue;
    }
    Live c;
    c.job = L.job;
    c.text = L.text;
    c.sample_of = js;
    GenerateRequest& q = c.req;
    q.id = L.req.id + uint64_t(j);
    q.prompt = L.req.prompt;
    q.prompt.insert(q.prompt.end(), g.tokens.begin(), g.tokens.end());
    q.seed = L.req.seed + uint64_t(j);
    q.n = 1;
    q.params = L.req.params;
    q.params.max_new_tokens = L.req.params.max_new_tokens - int(g.tokens.size());
    q.params.input_logprobs_from = -1;  // (computed before the pause)
    q.params.prior_output = L.req.params.prior_output + int(g.tokens.size());  // (penalties, min_new_tokens)
    retracted_.push_back(std::move(c));
    continued++;
  }
  retracted_samples_ += continued;
  L.text->pieces += continued;
  finish_piece(L.text, L.job);  // (this piece: the job ends here if nothing continues)
}

void ServeEngine::resume_retracted() {
  std::vector<Live> items;
  items.swap(retracted_);
  for (Live& c : items) place(std::move(c));
}

// Jobs that never reached a scheduler end as aborted with nothing generated.
static void abort_unstarted(const JobPtr& job) {
  {
    std::lock_guard<std::mutex> lock(job->mu);
    job->samples.resize(size_t(job->req.n));
    for (auto& sp : job->samples) {
      sp.finish = FinishReason::Abort;
      sp.done = true;
    }
    job->state = Job::State::Done;
    job->version++;
  }
  job->cv.notify_all();
}

// Pieces on the ranks are ordered aborted (their ends come back in the reports, with what they
// generated); retracted and held ones end here.
void ServeEngine::abort_where(const std::function<bool(const Job&)>& which) {
  for (auto& [key, L] : live_)
    if (which(*L.job)) orders_.abort.push_back(key);
  for (auto it = retracted_.begin(); it != retracted_.end();) {
    if (which(*it->job)) {
      abort_retracted(*it);
      it = retracted_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = held_.begin(); it != held_.end();) {
    if (which(**it)) {
      abort_unstarted(*it);
      std::lock_guard<std::mutex> lock(mu_);
      metrics_.requests_aborted++;
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
}

// Shutting down: every job ends now with what rank 0 has received, without asking the ranks.
void ServeEngine::abort_everything_here() {
  std::map<uint64_t, Live> live;
  live.swap(live_);
  for (auto& [key, L] : live) {
    {
      std::lock_guard<std::mutex> lock(L.job->mu);
      if (L.job->samples.size() < size_t(L.job->req.n)) L.job->samples.resize(size_t(L.job->req.n));
      for (int j = 0; j < L.req.n; j++) {
        SampleProgress& sp = L.job->samples[size_t(L.job_sample(j))];
        if (sp.done) continue;
        sp.finish = FinishReason::Abort;
        sp.done = true;
      }
    }
    finish_piece(L.text, L.job);
  }
  std::fill(rank_sequences_.begin(), rank_sequences_.end(), 0);
  abort_where([](const Job&) { return true; });
  orders_ = Orders{};
}

void ServeEngine::reply_deferred() {
  for (Control& c : deferred_) {
    ControlReply r;
    if (c.kind == Control::Kind::Flush) {
      r.message = "flushed " + std::to_string(flushed_) + " cached KV blocks";
    } else {
      r.message = "paused (retract): " + std::to_string(retracted_samples_) + " sample(s) retracted, " +
                  std::to_string(requeued_) + " request(s) not started put back in the queue";
    }
    refresh_metrics();
    if (c.reply) c.reply->set_value(r);
  }
  deferred_.clear();
  flushed_ = retracted_samples_ = requeued_ = 0;
}

namespace {

// A bucket of /update_weights_from_safetensors: its tensors' header entries and where its data starts.
struct Bucket {
  std::map<std::string, SafetensorsEntry> entries;
  const char* data = nullptr;
};
Bucket parse_bucket(const std::string& bytes, const std::string& what) {
  SafetensorsLayout l =
      parse_safetensors_bytes(what, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  return Bucket{std::move(l.entries), bytes.data() + l.data_offset};
}

// The staged buckets as one string for every rank: count, then each bucket's length and bytes.
std::string stage_frames(const std::vector<std::string>& buckets) {
  std::string out;
  auto put = [&](uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); };
  put(buckets.size());
  for (auto& b : buckets) {
    put(b.size());
    out += b;
  }
  return out;
}
std::vector<std::string> read_frames(const std::string& f) {
  std::vector<std::string> out;
  size_t at = 0;
  auto get = [&]() {
    EPMOE_ASSERT(at + 8 <= f.size(), "weight update frames: truncated");
    uint64_t v = 0;
    std::memcpy(&v, f.data() + at, 8);
    at += 8;
    return v;
  };
  const uint64_t n = get();
  for (uint64_t i = 0; i < n; i++) {
    const uint64_t len = get();
    EPMOE_ASSERT(at + len <= f.size(), "weight update frames: truncated");
    out.push_back(f.substr(at, len));
    at += len;
  }
  return out;
}

// The tensors' bytes: the buckets as received (a tensor whose offset is not aligned to its dtype
// copied once to a block of its own), kept alive with the previous update's (the checkpoint's
// overlay owner).
struct OverlayBytes {
  std::vector<std::string> buckets;                 // the safetensors bytes as received
  std::vector<std::unique_ptr<double[]>> blocks;    // copies of tensors misaligned in them
  std::shared_ptr<const void> previous;
};

}  // namespace

void ServeEngine::apply(Control& c) {
  ControlReply r;
  switch (c.kind) {
    case Control::Kind::Abort: abort_where([&](const Job& j) { return j.req.rid == c.a; }); break;
    case Control::Kind::AbortAll: abort_where([](const Job& j) { return !j.req.internal; }); break;
    case Control::Kind::AbortJob: abort_where([&](const Job& j) { return &j == c.job.get(); }); break;
    case Control::Kind::Flush:  // on every rank; answered once they reported
      orders_.flush = true;
      deferred_.push_back(std::move(c));
      return;
    case Control::Kind::Pause:
      if (c.a != "abort" && c.a != "in_place" && c.a != "retract") {
        r = {false, "mode: '" + c.a + "' is not one of abort, in_place, retract"};
        break;
      }
      paused_ = true;
      if (c.a == "abort") abort_where([](const Job& j) { return !j.req.internal; });
      r.message = "paused (" + c.a + ")";
      if (c.a == "retract") {  // answered once the ranks reported what they retracted
        orders_.retract = true;
        deferred_.push_back(std::move(c));
        return;
      }
      break;
    case Control::Kind::Resume:
      paused_ = false;
      resume_retracted();
      r.message = "continued";
      break;
    case Control::Kind::Update:
      if (pending_update_) {
        r = {false, "an update of the weights is already under way"};
        break;
      }
      staged_.clear(), staged_names_.clear();  // (a whole checkpoint replaces staged tensors)
      pending_update_ = std::move(c);  // replied to once the group has loaded it (run())
      return;
    case Control::Kind::Tensors: {
      if (pending_update_) {
        r = {false, "an update of the weights is already under way"};
        break;
      }
      // Checked against the loaded model before it is staged: names, dtypes, shapes, no tensor
      // twice. A refusal drops everything staged (the update is refused as a whole).
      try {
        if (c.a.empty() && (!c.commit || staged_.empty()))
          throw InputError("an empty body stages nothing (a commit needs tensors staged or sent with it)");
        const Bucket b = c.a.empty() ? Bucket{} : parse_bucket(c.a, "bucket " + std::to_string(staged_.size()));
        for (auto& [name, e] : b.entries) {
          rt_.ckpt->check_like(name, e.dtype, e.shape);
          if (!staged_names_.insert(name).second) throw InputError("tensor '" + name + "' was sent twice");
        }
        if (!c.a.empty()) staged_.push_back(std::move(c.a));
      } catch (const std::exception& e) {
        const size_t dropped = staged_.size();
        staged_.clear(), staged_names_.clear();
        r = {false, std::string(e.what()) + (dropped ? "; the " + std::to_string(dropped) +
                                                          " bucket(s) staged before are dropped" : "")};
        break;
      }
      if (!c.commit) {
        r.message = "staged " + std::to_string(staged_names_.size()) + " tensors in " + std::to_string(staged_.size()) +
                    " bucket(s)";
        break;
      }
      committing_ = std::move(staged_);  // (c.b, the version, is applied with the update)
      c.a.clear();
      staged_.clear(), staged_names_.clear();
      pending_update_ = std::move(c);  // replied to once the group has loaded it (run())
      return;
    }
  }
  refresh_metrics();  // before the reply: a caller that reads /metrics next sees the change
  if (c.reply) c.reply->set_value(r);
}

void ServeEngine::refresh_metrics() {
  const SchedulerStats& st = sched_->stats();
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.waiting = int64_t(held_.size() + retracted_.size());
  metrics_.running = metrics_.kv_blocks_total = metrics_.kv_blocks_used = metrics_.kv_blocks_cached = 0;
  for (const RankLoad& l : rank_load_) {
    metrics_.waiting += l.waiting;
    metrics_.running += l.running;
    metrics_.kv_blocks_total += l.kv_blocks_total;
    metrics_.kv_blocks_used += l.kv_blocks_used;
    metrics_.kv_blocks_cached += l.kv_blocks_cached;
  }
  metrics_.ranks = rank_load_;
  // Requests not on any rank yet (held during a pause or an update, retracted) wait at rank 0.
  metrics_.ranks[0].waiting += int64_t(held_.size() + retracted_.size());
  metrics_.kv_block_tokens = rt_.model->kv_pool().block_tokens();
  metrics_.steps = st.steps;  // (rank 0's: every rank runs every step)
  metrics_.step_seconds = st.step_seconds;
  metrics_.forward_seconds = st.forward_seconds;
  metrics_.paused = paused_;
  metrics_.weight_version = weight_version_;
}

// ---------------------------------------------------------------- every rank

// Rank 0's orders of this turn, the ones for this rank: new requests (a refusal is reported, not
// thrown: the request could never fit this rank's pool), then aborts, stops, retract, flush.
void ServeEngine::apply_orders(const std::string& bytes) {
  if (bytes.empty()) return;
  const json o = json::from_msgpack(bytes);
  const int me = rt_.group->rank();
  for (const json& s : o.at("submit")) {
    if (s.at(0).get<int>() != me) continue;
    const uint64_t key = s.at(1).get<uint64_t>();
    try {
      const size_t h = sched_->submit(s.at(2).get<GenerateRequest>());
      handle_of_[key] = h;
      key_of_[h] = key;
      report_["acc"].push_back(key);
    } catch (const InputError& e) {
      report_["ref"].push_back({key, std::string(e.what())});
    }
  }
  for (const json& k : o.at("abort"))
    if (auto it = handle_of_.find(k.get<uint64_t>()); it != handle_of_.end()) sched_->abort(it->second);
  for (const json& st : o.at("stop"))
    if (auto it = handle_of_.find(st.at(0).get<uint64_t>()); it != handle_of_.end())
      sched_->stop_sample(it->second, st.at(1).get<int>());
  if (o.at("retract").get<bool>()) {
    for (const auto& [key, h] : handle_of_) {
      const std::vector<Generation> res = sched_->results(h);  // (before the abort marks them)
      sched_->abort(h);
      sched_->forget(h);
      report_["ret"].push_back({key, generations_json(res)});
    }
    handle_of_.clear(), key_of_.clear();
  }
  if (o.at("flush").get<bool>()) {
    KvPool& pool = rt_.model->kv_pool();
    report_["flushed"] = pool.cached_blocks();
    pool.flush_prefix_cache();
  }
}

// Requests this rank's scheduler has finished go into the report, whole, and are forgotten here.
void ServeEngine::report_finished() {
  for (auto it = handle_of_.begin(); it != handle_of_.end();) {
    if (!sched_->finished(it->second)) {
      ++it;
      continue;
    }
    report_["fin"].push_back({it->first, generations_json(sched_->results(it->second))});
    sched_->forget(it->second);
    key_of_.erase(it->second);
    it = handle_of_.erase(it);
  }
}

std::string ServeEngine::take_report() {
  const KvPool& pool = rt_.model->kv_pool();
  report_["load"] = {int64_t(sched_->queued()), int64_t(sched_->running_sequences()), pool.total_blocks(),
                     pool.used_blocks(), pool.cached_blocks(), sched_->stats().steps};
  std::string out = to_bytes(report_);
  report_ = json::object();
  return out;
}

// Every rank's report on every rank (only rank 0 reads them; one allgather keeps the group's one
// kind of collective, each under its deadline).
std::vector<std::string> ServeEngine::gather_reports(const std::string& mine) {
  Group& g = *rt_.group;
  if (!g.distributed()) return {mine};
  const std::vector<int64_t> lens = g.allgather_i64(int64_t(mine.size()));
  std::vector<size_t> sizes;
  size_t total = 0;
  for (int64_t n : lens) sizes.push_back(size_t(n)), total += size_t(n);
  std::string all(total, '\0');
  g.allgatherv(mine.data(), mine.size(), all.data(), sizes);
  std::vector<std::string> out;
  size_t off = 0;
  for (size_t n : sizes) out.push_back(all.substr(off, n)), off += n;
  return out;
}

ServeEngine::Op ServeEngine::exchange(Op op, std::string& arg) {
  Group& g = *rt_.group;
  if (!g.distributed()) return op;
  const bool root = g.rank() == 0;
  const int64_t mine[2] = {root ? int64_t(op) : 0, root ? int64_t(arg.size()) : 0};
  std::vector<int64_t> all(size_t(g.size()) * 2);
  {
    // The other ranks wait here for rank 0's next command, for as long as no request comes: an
    // idle wait (Group::set_idle_waits), not a core each spinning. The arg below may be bulk.
    IdleWaits idle(g);
    g.allgather(mine, sizeof mine, all.data());
  }
  const Op got = Op(all[0]);
  const size_t len = size_t(all[1]);
  if (len > 0) {
    // In pieces of at most 1 GiB (a weight update's buckets may be GBs; MPI counts are ints).
    std::string recv(len, '\0');
    constexpr size_t kPiece = size_t(1) << 30;
    for (size_t off = 0; off < len; off += kPiece) {
      const size_t n = std::min(kPiece, len - off);
      std::vector<size_t> sizes(size_t(g.size()), 0);
      sizes[0] = n;
      g.allgatherv(root ? arg.data() + off : nullptr, root ? n : 0, recv.data() + off, sizes);
    }
    arg = std::move(recv);
  } else {
    arg.clear();
  }
  return got;
}

// Checks the checkpoint at `path` against the one loaded (every rank checks what it would load),
// then, when every rank agrees, swaps the model. Returns "" or the first rank's reason to refuse.
std::string ServeEngine::do_update(const std::string& arg, bool tensors) {
  Group& g = *rt_.group;
  std::string err;
  std::unique_ptr<Checkpoint> next;
  ModelConfig cfg;
  const std::string& path = arg;
  if (tensors) {
    // The loaded checkpoint's files with every tensor sent so far overlaid (this update's over
    // the earlier ones'), the bytes in aligned blocks this rank owns.
    try {
      auto owner = std::make_shared<OverlayBytes>();
      owner->previous = rt_.ckpt->overlay_owner();
      owner->buckets = g.rank() == 0 ? std::move(committing_) : read_frames(arg);
      committing_.clear();
      std::map<std::string, TensorView> views = rt_.ckpt->overlaid();
      for (size_t i = 0; i < owner->buckets.size(); i++) {
        const Bucket b = parse_bucket(owner->buckets[i], "bucket " + std::to_string(i));
        for (auto& [name, e] : b.entries) {
          TensorView v;
          v.dtype = e.dtype;
          v.shape = e.shape;
          v.data = b.data + e.begin;  // used in place where aligned to its dtype, else copied once
          if (reinterpret_cast<uintptr_t>(v.data) % dtype_size(e.dtype) != 0) {
            const size_t n = e.end - e.begin;
            owner->blocks.emplace_back(new double[(n + 7) / 8 + 1]);
            std::memcpy(owner->blocks.back().get(), v.data, n);
            v.data = owner->blocks.back().get();
          }
          views[name] = v;
        }
      }
      cfg = rt_.cfg;
      next = std::make_unique<Checkpoint>(rt_.ckpt->dir());
      next->overlay(std::move(views), owner);
    } catch (const std::exception& e) {
      err = e.what();
      if (err.empty()) err = "unknown error";
    }
  } else try {
    const nlohmann::json have = architecture_of(rt_.ckpt->dir()), want = architecture_of(path);
    for (auto& [k, v] : have.items())
      if (!want.contains(k) || want[k] != v)
        throw InputError(path + "/config.json: " + k + " is " + (want.contains(k) ? want[k].dump() : "missing") +
                         ", the loaded model has " + v.dump());
    for (auto& [k, v] : want.items())
      if (!have.contains(k)) throw InputError(path + "/config.json: " + k + " is not in the loaded model's config");
    cfg = load_model_config(path);
    next = std::make_unique<Checkpoint>(path);
    std::vector<std::string> a = rt_.ckpt->names(), b = next->names();
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b) {
      std::vector<std::string> diff;
      std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(diff));
      throw InputError(path + ": tensor " + diff.front() +
                       (next->contains(diff.front()) ? " is not in the loaded model" : " is missing"));
    }
    for (const std::string& name : a) {
      const TensorView x = rt_.ckpt->get(name), y = next->get(name);
      if (x.shape != y.shape || x.dtype != y.dtype)
        throw InputError(path + ": tensor " + name + " is " + shape_text(y) + ", the loaded model's is " +
                         shape_text(x));
    }
  } catch (const std::exception& e) {
    err = e.what();
    if (err.empty()) err = "unknown error";
  }
  if (std::string verdict = agree(err); !verdict.empty()) return verdict;
  // Every rank agrees: the old model goes first (its device memory with it), then the new one.
  sched_.reset();
  handle_of_.clear(), key_of_.clear();  // (empty: no rank had a request)
  rt_.model.reset();
  rt_.ckpt = std::move(next);
  rt_.cfg = cfg;
  if (!tensors) rt_.options.model_dir = path;
  rt_.model = make_model(rt_.device, rt_.cfg, *rt_.ckpt, rt_.placement, g.rank(), rt_.options.compute, rt_.options.kv,
                         rt_.options.fp8_compute, rt_.options.lm_head);
  make_scheduler();
  return "";
}

std::string ServeEngine::agree(const std::string& err) {
  Group& g = *rt_.group;
  // Every rank's verdict; the first refusal (rank order) is the answer everywhere.
  const std::vector<int64_t> lens = g.allgather_i64(int64_t(err.size()));
  size_t total = 0;
  std::vector<size_t> sizes;
  for (int64_t n : lens) {
    sizes.push_back(size_t(n));
    total += size_t(n);
  }
  if (total > 0) {
    std::string all(total, '\0');
    if (g.distributed()) {
      g.allgatherv(err.data(), err.size(), all.data(), sizes);
    } else {
      all = err;
    }
    size_t off = 0;
    for (size_t r = 0; r < sizes.size(); r++) {
      if (sizes[r] > 0) return (g.distributed() ? "rank " + std::to_string(r) + ": " : "") + all.substr(off, sizes[r]);
      off += sizes[r];
    }
  }
  return "";
}

void ServeEngine::run() {
  Group& g = *rt_.group;
  const bool root = g.rank() == 0;
  const auto heartbeat = std::chrono::duration<double>(opt_.heartbeat);
  auto last = std::chrono::steady_clock::now();
  for (;;) {
    Op op = Op::Idle;
    std::string arg;
    if (root) {
      take_inbox();
      // An update waits for the requests in flight -- unless they are paused in place, where it
      // would wait for ever: they are retracted instead (continued on the new weights).
      if (pending_update_ && paused_ && !live_.empty()) orders_.retract = true;
      if (shutdown_.load()) {
        op = Op::Shutdown;
      } else if (pending_update_ && live_.empty() && orders_.empty()) {
        op = pending_update_->kind == Control::Kind::Tensors ? Op::UpdateTensors : Op::Update;
        arg = pending_update_->a;
        // The buckets travel to the other ranks (one string, framed); rank 0 keeps its own.
        if (op == Op::UpdateTensors && g.distributed()) arg = stage_frames(committing_);
      } else if (!paused_ && !live_.empty()) {
        op = Op::Step;
        arg = encode_orders();
      } else if (!orders_.empty()) {
        arg = encode_orders();  // an idle turn that carries orders (aborts, retract, flush)
      } else {
        // Nothing to run: sleep until something arrives or the heartbeat is due.
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait_until(lock, last + heartbeat, [&] {
          return !inbox_.empty() || !controls_.empty() || shutdown_.load();
        });
        const bool due = std::chrono::steady_clock::now() >= last + heartbeat;
        lock.unlock();
        if (!due) continue;  // take what arrived first
      }
    }
    op = exchange(op, arg);
    last = std::chrono::steady_clock::now();
    switch (op) {
      case Op::Idle:
      case Op::Step: {
        apply_orders(arg);
        if (op == Op::Step) sched_->step();
        report_finished();
        const std::vector<std::string> reports = gather_reports(take_report());
        if (root) take_reports(reports);
        break;
      }
      case Op::Shutdown:
        if (root) {
          abort_everything_here();
          // Whatever still arrives is answered at once: no HTTP thread may wait on a loop that ended.
          std::deque<JobPtr> jobs;
          std::deque<Control> controls;
          {
            std::lock_guard<std::mutex> lock(mu_);
            stopped_ = true;
            jobs.swap(inbox_);
            controls.swap(controls_);
          }
          for (auto& j : jobs) reject(j, "the server is shutting down", 503);
          for (auto& c : controls)
            if (c.reply) c.reply->set_value({false, "the server is shutting down"});
          for (auto& c : deferred_)
            if (c.reply) c.reply->set_value({false, "the server is shutting down"});
          deferred_.clear();
          if (pending_update_ && pending_update_->reply)
            pending_update_->reply->set_value({false, "the server is shutting down"});
          pending_update_.reset();
        }
        return;
      case Op::Update:
      case Op::UpdateTensors: {
        const bool tensors = op == Op::UpdateTensors;
        const std::string err = do_update(arg, tensors);
        if (root) {
          ControlReply r;
          if (err.empty()) {
            std::lock_guard<std::mutex> lock(mu_);
            weight_version_ = pending_update_->b.empty() ? weight_version_ : pending_update_->b;
            if (!tensors) model_path_ = arg;
            r.message = (tensors ? "loaded " + std::to_string(rt_.ckpt->overlaid().size()) + " tensors sent so far"
                                 : "loaded " + arg) +
                        " (weight_version " + weight_version_ + ")";
          } else {
            r = {false, err};
          }
          pending_update_->reply->set_value(r);
          pending_update_.reset();
        }
        break;
      }
    }
    if (root) {
      // What waited for an update (or arrived during one) runs now, unless paused.
      if (!paused_ && !pending_update_ && !held_.empty()) {
        std::deque<JobPtr> held;
        held.swap(held_);
        for (auto& j : held) admit_job(j);
      }
      refresh_metrics();
    }
  }
}

}  // namespace epmoe
