// The serving loop of every rank, and rank 0's door to it for the HTTP threads.
//
// Rank 0 owns the scheduler and every request (the other ranks hold experts and take part in each
// MoE layer with no tokens of their own). Each turn of rank 0's loop it takes what the HTTP
// threads queued (requests, aborts, control), chooses one command for the group -- step, idle,
// update the weights, shut down -- and tells every rank with one collective, so all ranks step
// together and a rank that dies or hangs is named by the group's timeout (never a silent hang).
// While idle it still sends a heartbeat every `heartbeat` seconds, well inside --comm-timeout.
//
// Tokens reach the jobs as the scheduler chooses them (on_token): the text is decoded there, stop
// strings are matched there (the sample then stops at once), and the waiting HTTP thread is
// notified. Requests in flight when new weights are asked for finish on the old weights: the
// update waits until the scheduler is empty, and requests that arrive meanwhile wait for it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/runtime.h"
#include "engine/scheduler.h"
#include "serve/job.h"
#include "tokenizer/tokenizer.h"

namespace epmoe {

struct ServeEngineOptions {
  SchedulerOptions scheduler;
  double heartbeat = 1.0;               // seconds between idle collectives (below --comm-timeout)
  std::string weight_version = "default";
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
  // rank 0
  void take_inbox();
  void apply(Control& c);
  void admit_job(const JobPtr& job);
  static void reject(const JobPtr& job, const std::string& why, int status);
  void on_token(size_t handle, int sample, int32_t token);
  void finish_done_jobs();
  void finish_job(size_t handle, const JobPtr& job);
  void abort_where(const std::function<bool(const Job&)>& which);
  void refresh_metrics();
  // every rank
  Op exchange(Op op, std::string& arg);
  // path: a checkpoint folder; or, with tensors, the staged buckets (framed by stage_frames()).
  std::string do_update(const std::string& arg, bool tensors);
  // Every rank's verdict: "" when all agree, else the first refusal (rank order).
  std::string agree(const std::string& err);

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
  std::atomic<bool> shutdown_{false};
  bool stopped_ = false;  // the loop has ended (under mu_): calls are answered at once

  // rank 0's engine-thread state
  // A job's text state, shared by its handles (a retracted job's samples continue as handles of
  // their own).
  struct JobText {
    std::vector<std::unique_ptr<StreamDecoder>> decoders;  // per sample, when there is a tokenizer
    std::vector<std::string> raw;                         // per sample: all decoded text so far
    int pieces = 1;  // handles and retracted continuations of the job still to finish
  };
  struct Live {
    JobPtr job;
    std::shared_ptr<JobText> text;
    int sample_of = -1;  // a continuation: its one sample is the job's sample sample_of
    GenerateRequest req;  // as submitted (a retract continues from it)
    int job_sample(int j) const { return sample_of >= 0 ? sample_of : j; }
  };
  struct Retracted {
    Live live;  // req: the continuation to submit on continue_generation
  };
  std::map<size_t, Live> live_;     // scheduler handle -> job
  std::vector<Retracted> retracted_;  // paused with mode retract: submitted again on continue
  void retract_all();
  void resume_retracted();
  void finish_piece(const std::shared_ptr<JobText>& text, const JobPtr& job);
  void record_sample(SampleProgress& sp, const Generation& g, JobText* text, int job_sample) const;
  void abort_retracted(const Retracted& c);
  std::deque<JobPtr> held_;         // arrived while paused or while an update drains
  bool paused_ = false;
  std::optional<Control> pending_update_;
  std::vector<std::string> staged_;      // Tensors buckets not yet committed (rank 0)
  std::set<std::string> staged_names_;
  std::vector<std::string> committing_;  // the buckets of the update under way (rank 0)
  int64_t next_request_id_ = 0;
};

}  // namespace epmoe
