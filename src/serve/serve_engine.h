// The serving loop of every rank, and rank 0's door to it for the HTTP threads.
//
// Data-parallel attention (the default): every rank runs its own scheduler over its own KV pool
// and serves the requests rank 0 gives it -- attention, dense layers, sampling -- while the MoE
// layers of each step run over all ranks together through the backend (a rank with no tokens
// still takes part). Rank 0 runs HTTP and the tokenizer and owns every request's text: it assigns
// each request (its n samples together) to the rank with the fewest sequences in flight, then
// the fewest KV blocks in use. With --dp-attention off every request goes to rank 0.
//
// Each turn of the group: rank 0 takes what the HTTP threads queued, chooses one command -- step,
// idle, update the weights, shut down -- and sends it with the turn's orders (new requests per
// rank, aborts, stops, retract, flush) in one collective; every rank applies the orders that are
// its own and steps; then every rank's report (tokens chosen with their log-probs, requests
// accepted, refused, finished or retracted, its load) reaches rank 0 in a second collective,
// and rank 0 decodes text, matches stop strings and wakes the HTTP threads. A stop string found
// in step k's token is ordered before step k+1 runs, so no token follows it. Every wait is a
// collective under the group's deadline: a rank that dies or hangs is named (never a silent
// hang); while idle rank 0 still sends a heartbeat every `heartbeat` seconds.
//
// The kernels are batch-invariant and sequence ids are global, so a request's tokens and
// log-probs are the same bits whichever rank serves it and whatever runs beside it. Requests in
// flight when new weights are asked for finish on the old weights: the update waits until no rank
// has a request, and requests that arrive meanwhile wait for it -- except while paused in place,
// when the requests in flight are retracted (their tokens so far kept, recomputed on the new
// weights when generation continues) and the update applies at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "serve/job.h"
#include "tokenizer/tokenizer.h"

namespace epmoe {

struct ServeEngineOptions {
  SchedulerOptions scheduler;
  double heartbeat = 1.0;               // seconds between idle collectives (below --comm-timeout)
  std::string weight_version = "default";
  bool dp_attention = true;             // requests spread over the ranks (false: all on rank 0)
};

// One rank's share of the load, as its last report gave it.
struct RankLoad {
  int64_t waiting = 0, running = 0;  // requests queued in its scheduler, sequences running
  int64_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0;
  int64_t steps = 0;
  int64_t requests = 0;  // requests (and retracted continuations) rank 0 has given it so far
};

// The figures /metrics and /server_info print (a snapshot, taken under the engine's lock).
struct ServeMetrics {
  int64_t requests_received = 0, requests_finished = 0, requests_aborted = 0, requests_rejected = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0, cached_tokens = 0;
  int64_t waiting = 0, running = 0;  // requests queued (not yet admitted) and sequences running
  int64_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0, kv_block_tokens = 0;
  int64_t steps = 0;
  double step_seconds = 0, forward_seconds = 0;
  bool paused = false;
  std::string weight_version;
  std::vector<RankLoad> ranks;  // per rank (the figures above are their sums, plus rank 0's queues)
};

// The reply to a control call.
struct ControlReply {
  bool ok = true;
  std::string message;
};

class ServeEngine {
 public:
  // `rt` must outlive the engine; `tok` may be null (ids only).
  ServeEngine(Runtime& rt, const Tokenizer* tok, ServeEngineOptions opt);
  ~ServeEngine();

  // ---- HTTP threads (rank 0) ----
  // Queues a job; wait on it (Job::wait_accepted, wait_done).
  void submit(const JobPtr& job);
  // Aborts the unfinished jobs with this rid (true when there was one).
  void abort(const std::string& rid);
  void abort_all();
  // Aborts one job (a client that went away).
  void abort_job(const JobPtr& job);
  ControlReply flush_cache();
  // mode "abort": running and queued requests end with finish "abort"; "in_place": they wait;
  // "retract": their KV blocks go back and they wait outside the scheduler, each unfinished
  // sample to continue from its tokens so far (prompt + output recomputed, the same draws: the
  // same bits as a run never paused). New requests wait until continue_generation() either way.
  ControlReply pause(const std::string& mode);
  ControlReply resume();
  // Loads `model_path` on every rank once the requests in flight are done (same architecture and
  // shapes, else refused with the first difference); the new weights answer every later request.
  ControlReply update_weights(const std::string& model_path, const std::string& weight_version);
  // The trainer's weights over HTTP (no disk): `bucket` is a safetensors file's bytes holding some
  // of the model's tensors (same names, dtypes and shapes, else refused naming the first that
  // differs, and everything staged so far is dropped). Buckets are staged; the one with `commit`
  // applies them all on every rank once the requests in flight are done, the tensors not sent
  // keeping their values. A refused update leaves the old weights serving.
  ControlReply update_weights_from_bytes(std::string bucket, bool commit, const std::string& weight_version);
  ServeMetrics metrics();
  std::string weight_version();
  // The checkpoint folder serving now (the last /update_weights_from_disk's).
  std::string model_path();
  const ModelConfig& config() const { return rt_.cfg; }
  // Ends the loop on every rank (from a signal handler too: only sets a flag).
  void request_shutdown() { shutdown_.store(true); }

  // ---- every rank: the loop; returns when rank 0 sent shut down ----
  void run();

 private:
  enum class Op : int32_t { Idle = 0, Step = 1, Update = 2, Shutdown = 3, UpdateTensors = 4 };
  struct Control {
    enum class Kind { Abort, AbortAll, AbortJob, Flush, Pause, Resume, Update, Tensors } kind;
    std::string a, b;  // rid | mode | path | safetensors bytes, version
    JobPtr job;
    std::shared_ptr<std::promise<ControlReply>> reply;
    bool commit = true;  // Tensors: apply what is staged
  };
  ControlReply call(Control c);

  // ---- rank 0: requests, text, orders ----
  // A job's text state, shared by its pieces (a retracted job's samples continue as pieces of
  // their own).
  struct JobText {
    std::vector<std::unique_ptr<StreamDecoder>> decoders;  // per sample, when there is a tokenizer
    std::vector<std::string> raw;                         // per sample: all decoded text so far
    int pieces = 1;  // pieces and retracted continuations of the job still to finish
  };
  // One request as a rank's scheduler runs it: a job, or one retracted sample of a job.
  struct Live {
    JobPtr job;
    std::shared_ptr<JobText> text;
    int sample_of = -1;   // a continuation: its one sample is the job's sample sample_of
    GenerateRequest req;  // as submitted (a retract continues from it)
    int rank = 0;         // whose scheduler runs it
    bool accepted = false;  // that rank's scheduler took it
    int job_sample(int j) const { return sample_of >= 0 ? sample_of : j; }
  };
  // The orders of the next turn (rank 0 writes them, every rank applies its own).
  struct Orders {
    std::vector<uint64_t> submit;                 // keys of live_ to submit on their rank
    std::vector<uint64_t> abort;                  // keys
    std::vector<std::pair<uint64_t, int>> stop;   // (key, sample): a stop string matched
    bool retract = false, flush = false;
    bool empty() const { return submit.empty() && abort.empty() && stop.empty() && !retract && !flush; }
  };
  void take_inbox();
  void apply(Control& c);
  void admit_job(const JobPtr& job);
  uint64_t place(Live L);  // a new piece on the least loaded rank; ordered submitted
  int least_loaded_rank() const;
  static void reject(const JobPtr& job, const std::string& why, int status);
  void abort_where(const std::function<bool(const Job&)>& which);
  void refresh_metrics();
  std::string encode_orders();
  // The reports of every rank (rank order): what their schedulers did this turn.
  void take_reports(const std::vector<std::string>& reports);
  void on_accepted(uint64_t key);
  void on_refused(uint64_t key, const std::string& why);
  void on_token(uint64_t key, int sample, int32_t token, const float* logprob,
                std::vector<std::pair<int32_t, float>> top, std::vector<float> ids, std::vector<int32_t> mask);
  void finish_piece_of(uint64_t key, const std::vector<Generation>& res);
  void retracted_piece(uint64_t key, const std::vector<Generation>& res);
  void resume_retracted();
  void finish_piece(const std::shared_ptr<JobText>& text, const JobPtr& job);
  void record_sample(SampleProgress& sp, const Generation& g, JobText* text, int job_sample) const;
  void abort_retracted(const Live& c);
  void abort_everything_here();  // shutdown: every job ends now, without the other ranks
  void reply_deferred();

  // ---- every rank: its scheduler, the orders, its report ----
  void apply_orders(const std::string& orders);
  void report_finished();
  std::string take_report();
  std::vector<std::string> gather_reports(const std::string& mine);
  Op exchange(Op op, std::string& arg);
  // path: a checkpoint folder; or, with tensors, the staged buckets (framed by stage_frames()).
  std::string do_update(const std::string& arg, bool tensors);
  // Every rank's verdict: "" when all agree, else the first refusal (rank order).
  std::string agree(const std::string& err);
  void make_scheduler();

  Runtime& rt_;
  const Tokenizer* tok_;
  ServeEngineOptions opt_;
  std::unique_ptr<Scheduler> sched_;

  std::mutex mu_;  // guards inbox_, controls_, metrics_, weight_version_
  std::condition_variable wake_;
  std::deque<JobPtr> inbox_;
  std::deque<Control> controls_;
  ServeMetrics metrics_;
  std::string weight_version_;
  std::string model_path_;
  std::atomic<bool> shutdown_{false};
  bool stopped_ = false;  // the loop has ended (under mu_): calls are answered at once

  // rank 0's engine-thread state
  std::map<uint64_t, Live> live_;   // key -> piece in some rank's scheduler
  std::vector<Live> retracted_;     // paused with mode retract: submitted again on continue
  std::deque<JobPtr> held_;         // arrived while paused or while an update drains
  bool paused_ = false;
  std::optional<Control> pending_update_;
  std::vector<Control> deferred_;   // flush and retract: answered once the ranks reported
  int64_t flushed_ = 0, retracted_samples_ = 0, requeued_ = 0;  // this turn's, for deferred_
  Orders orders_;
  uint64_t next_key_ = 0;
  std::vector<int64_t> rank_sequences_;  // sequences of the live pieces on each rank
  std::vector<RankLoad> rank_load_;      // each rank's last report
  std::vector<std::string> staged_;      // Tensors buckets not yet committed (rank 0)
  std::set<std::string> staged_names_;
  std::vector<std::string> committing_;  // the buckets of the update under way (rank 0)
  int64_t next_request_id_ = 0;

  // every rank: its scheduler's requests by key, and this turn's report
  std::map<uint64_t, size_t> handle_of_;
  std::map<size_t, uint64_t> key_of_;
  nlohmann::json report_;
};

}  // namespace epmoe
