// Every flag of every subcommand, bound to the structs of cli/commands.h: the one source that
// includes CLI11 (flags.h says why).
#include "cli/flags.h"

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "ep/fault.h"

namespace epmoe {

namespace {

struct Command {
  CLI::App* app;  // the subcommand, to ask whether it was chosen
  std::function<int()> run;
};

// Every device's backends for a flag's help: "cpu: a|b; cuda: c|d" (sep between names).
std::string backends_by_device(const char* sep) {
  std::string names;
  for (Device d : all_devices()) {
    std::string list;
    for (auto& n : backend_names(d)) list += (list.empty() ? "" : sep) + n;
    names += std::string(names.empty() ? "" : "; ") + device_name(d) + ": " + list;
  }
  return names;
}

void add_model_option(CLI::App& cmd, RunOptions& o) {
  cmd.add_option("--model", o.model_dir, "Hugging Face model folder (config.json + safetensors)")->required();
}

// Every flag of a model-running command; check lists its own --moe-a2a-backend (with_backend false).
void add_run_options(CLI::App& cmd, RunOptions& o, bool with_backend = true) {
  add_model_option(cmd, o);
  cmd.add_option("--device", o.device,
                 "cpu (MPI ranks: mpirun -np R), or cuda: one process per GPU (several GPUs through "
                 "scripts/gpu-launch.sh R; needs a build with -DEPMOE_CUDA=ON)")
      ->check(CLI::IsMember(device_names()))
      ->capture_default_str();
  cmd.add_option("--threads", o.threads, "Worker threads per rank on the CPU (0: the cores available to this rank)")
      ->check(CLI::NonNegativeNumber);
  if (with_backend) {
    cmd.add_option("--moe-a2a-backend", o.backend,
                   "All-to-all backend for expert parallelism (" + backends_by_device("|") + ")")
        ->capture_default_str();
  }
  cmd.add_option("--combine", o.combine,
                 "deterministic: one row per (token, slot) summed at home in slot order (bit-identical for every "
                 "layout); fast: per-rank partial sums (fewer bytes, ~1e-6 differences; every backend has it on cpu, "
                 "some on cuda: a backend without it is refused, naming those with it)")
      ->check(CLI::IsMember({"deterministic", "fast"}))
      ->capture_default_str();
  cmd.add_option("--ep-redundant-experts", o.redundant_experts,
                 "Extra replicas of experts 0..N-1 (or as the --placement file says)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--placement", o.placement_file, "JSON file: logical expert -> list of physical slots");
  cmd.add_option("--max-dispatch-tokens-per-rank", o.max_dispatch_tokens_per_rank,
                 "Capacity of the low-latency backend's buffers per round; more tokens go in further rounds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--chunk-tokens", o.chunk_tokens, "Tokens per chunk of the pipelined (fused) backend")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--comm-timeout", o.comm_timeout, "Seconds a rank waits on its peers before aborting the group")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_flag("--check-numerics", o.check_numerics,
               "Stop at the first layer (cpu) or the logits (cuda) that produce NaN or Inf");
  cmd.add_flag("--check-weights", o.check_weights, "Scan the weights this rank loads for NaN/Inf");
  cmd.add_option("--compute", o.compute,
                 "Activation precision of the matmuls. cpu: f32 (default), or bf16 (activations rounded to bf16 and "
                 "multiplied with the AVX512-BF16 dot product's arithmetic on bf16 weights -- on Intel as FMAs, the "
                 "same bits; needs that CPU feature, else f32 is used). cuda: bf16 (default: bf16 tensor cores, fp32-grade products outside the routed "
                 "experts) or f32")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd.add_option("--fp8-compute", o.fp8_compute,
                 "Routed experts of an FP8 checkpoint. dequant (default): exact, code x block scale in fp32 -- the "
                 "arithmetic of the goldens, on both devices. tensor-core (cuda only): e4m3 weights kept on the GPU "
                 "(half the bytes), activations quantized per token and 128-channel group, fp8 tensor-core products; "
                 "faster at decode, not bit-near the goldens (docs/gpu.md)")
      ->check(CLI::IsMember({"dequant", "tensor-core"}))
      ->capture_default_str();
  cmd.add_option("--lm-head", o.lm_head,
                 "How the lm_head is read. checkpoint (default): as stored, exact. int8 (cpu only): rows quantized at "
                 "load to int8 with one bf16 scale per 32 weights (llama.cpp Q8_0's layout and error, |w - q s| <= "
                 "s/2): half the bytes of a bf16 head, the matrix every decode step reads whole -- faster decode, "
                 "logits no longer the checkpoint's")
      ->check(CLI::IsMember({"checkpoint", "int8"}))
      ->capture_default_str();
  cmd.add_option("--kv-cache-tokens", o.kv_cache_tokens,
                 "Token positions of the paged KV cache per rank, allocated at start (0: a quarter of the available "
                 "memory on the CPU; on the GPU what the weights leave under --mem-fraction; at most 1M). Requests "
                 "wait until their blocks fit; one that could never fit is refused")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--kv-cache-dtype", o.kv_cache_dtype,
                 "What the KV cache stores K and V as. auto (default): the model's dtype -- bf16 on the GPU for a bf16 "
                 "checkpoint computed in bf16 (half the bytes per token: twice the positions, half the KV reads), "
                 "fp32 otherwise and always on the CPU. bf16 (cuda only), fp32. Attention computes in fp32 either way: "
                 "the bits still never depend on the batch, the layout, the chunking or the backend")
      ->check(CLI::IsMember({"auto", "bf16", "fp32"}))
      ->capture_default_str();
  cmd.add_option("--mem-fraction", o.mem_fraction,
                 "GPU: the share of the device's memory the weights and the KV cache may take together when "
                 "--kv-cache-tokens is not given (sglang's --mem-fraction-static; default 0.80: the rest stays for "
                 "activations, CUDA graphs and NCCL)")
      ->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--kv-block-size", o.kv_block_tokens,
                 "Tokens per KV block: the unit of paging and of prefix reuse (the bits never depend on it)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd.add_flag("--audit", o.audit, "Run the reduction audit of the backend once before the work");
  cmd.add_flag("--batch-invariant", o.batch_invariant,
               "A row's bits never depend on the batch: always so on both devices (no split-K, fixed-order "
               "reductions); accepted for compatibility, costs nothing");
}

Command register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Show a model's architecture, sizes, parameters and dtypes");
  auto o = std::make_shared<RunOptions>();
  add_model_option(*cmd, *o);
  return {cmd, [o] { return run_info(*o); }};
}

Command register_score(CLI::App& app) {
  auto* cmd = app.add_subcommand("score", "Write the logits at every position of a token sequence (safetensors)");
  auto o = std::make_shared<ScoreOptions>();
  add_run_options(*cmd, o->run);
  cmd->add_option("--ids", o->ids, "Comma-separated token ids")->required();
  cmd->add_option("--out", o->out,
                  "Output safetensors file: tensor 'logits' F32 [T, vocab], and 'token_logprobs' F32 [T]: entry t >= 1 "
                  "is log_softmax(logits[t-1] / temperature)[ids[t]], entry 0 NaN")
      ->required();
  cmd->add_option("--temperature", o->temperature,
                  "Temperature of token_logprobs (0 reports 1's, as generate does for greedy decoding)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  return {cmd, [o] { return run_score(*o); }};
}

Command register_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "generate", "Greedy decoding or seeded sampling from token ids or text, with log-probs and JSON output");
  auto o = std::make_shared<GenerateOptions>();
  add_run_options(*cmd, o->run);
  cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt as comma-separated token ids; prints the new ids")
      ->each([o](const std::string&) { o->prompt_ids_given = true; });
  cmd->add_option("--prompts-file", o->prompts_file,
                  "File with one prompt per line: comma-separated ids, or text (needs tokenizer files; a line "
                  "starting with a quote is a JSON string, for newlines). Prompts are spread over the ranks, results "
                  "print in input order");
  cmd->add_option("--prompt", o->prompt, "Prompt text (needs tokenizer files in the model folder); prints text")
      ->each([o](const std::string&) { o->prompt_given = true; });
  cmd->add_flag("--chat", o->chat, "Wrap --prompt in the ChatML template");
  cmd->add_option("--system", o->system, "System message for --chat");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate per prompt")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the eos ids of config.json / generation_config.json");
  cmd->add_option("--temperature", o->sampling.temperature,
                  "Sampling temperature; 0 (default): greedy, ties to the lower id")
      ->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "Sample among the k most likely ids (-1: off)")->capture_default_str();
  cmd->add_option("--top-p", o->sampling.top_p,
                  "Sample among the most likely ids whose probability reaches p (1: off)")
      ->capture_default_str();
  cmd->add_option("--min-p", o->sampling.min_p, "Sample among the ids with p >= min_p * p_max (0: off)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed,
                  "Sampling seed (sample j of a prompt uses seed + j); without it a fresh one is drawn and reported")
      ->each([o](const std::string&) { o->seed_given = true; });
  cmd->add_option("--n", o->n, "Samples per prompt (with --temperature > 0)")->capture_default_str();
  cmd->add_option("--logprobs", o->top_logprobs,
                  "Report each generated token's log-prob, log_softmax(logits / T)[token] in fp32 (T = 1 when "
                  "greedy); --logprobs N also the N most likely ids at each step with theirs")
      ->expected(0, 1)
      ->default_str("0")
      ->each([o](const std::string&) { o->logprobs = true; });
  cmd->add_option("--max-batch-tokens", o->max_batch_tokens,
                  "Tokens one step feeds per rank: running sequences' decode tokens first, then prompt chunks "
                  "(chunked prefill); 0: unlimited")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-running-requests", o->max_running_requests,
                  "Sequences in flight per rank; the others wait in the queue and join as sequences end (0: unlimited)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache,
                  "Compute every prompt in full instead of reusing KV blocks cached from earlier prompts with the "
                  "same prefix (the bits are the same either way)");
  cmd->add_flag("--json", o->json,
                "One JSON object per (prompt, sample) per line: index, sample, seed, prompt_ids, output_ids, "
                "output_logprobs (with --logprobs), top_logprobs (--logprobs N), finish_reason, cached_tokens (prompt tokens reused from the prefix cache), text (text prompts)");
  return {cmd, [o] { return run_generate(*o); }};
}

Command register_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Text to token ids with the model's tokenizer (tokenizer.json or vocab.json + merges.txt)");
  auto o = std::make_shared<TokenizeOptions>();
  cmd->add_option("--model", o->model_dir, "Model folder holding the tokenizer files")->required();
  cmd->add_option("--text", o->text, "Text to encode; prints comma-separated ids")->each([o](const std::string&) {
    o->text_given = true;
  });
  cmd->add_option("--jsonl", o->jsonl, "File with one JSON string per line; prints one JSON array of ids per line");
  cmd->add_flag("--decode", o->decode, "With --text: read comma-separated ids and print their text instead");
  return {cmd, [o] { return run_tokenize(*o); }};
}

Command register_check(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "check",
      "Prove every a2a backend against the single-process reference: a reduction audit with probe experts, then the "
      "log-probabilities, bits and greedy tokens of real sequences. Run it under mpirun -np R (CPUs), or with --device cuda under scripts/gpu-launch.sh R (one "
      "process per GPU).");
  auto o = std::make_shared<CheckCliOptions>();
  add_run_options(*cmd, o->run, /*with_backend=*/false);
  cmd->add_option("--moe-a2a-backend", o->backends,
                  "'all' (every backend of the device) or a comma-separated list (" + backends_by_device(",") + ")")
      ->capture_default_str();
  cmd->add_option("--prompts", o->prompts, "Random prompts, spread over the ranks")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--prompt-len", o->prompt_len, "Tokens per prompt")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--gen-tokens", o->gen_tokens, "Greedy tokens generated per prompt")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the random prompts")->capture_default_str();
  cmd->add_option("--json", o->json, "Also write the results as JSON to this file");
  std::string faults;
  for (auto& n : fault_names()) faults += (faults.empty() ? "" : "|") + n;
  cmd->add_option("--inject", o->inject, "Inject a bug class into every backend to see the check catch it: " + faults +
                                      " (cuda: double-reduce)");
  cmd->add_option("--reference", o->reference,
                  "'local': each rank recomputes its sequences with all experts in-process (the model must fit); or a "
                  "logits file written by a single-process `epmoe score`")
      ->capture_default_str();
  return {cmd, [o] { return run_check_command(*o); }};
}

Command register_synth(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "synth", "Write a random checkpoint with a real model's shapes (hub layout, sharded) for benchmarks");
  auto o = std::make_shared<SynthOptions>();
  cmd->add_option("--like", o->like,
                  "A preset (qwen3-30b-a3b, qwen3-235b-a22b, qwen3-30b-a3b-fp8, deepseek-v2-lite, deepseek-v3, "
                  "glm-4.7-flash) or a config.json to copy")
      ->required();
  cmd->add_option("--layers", o->layers, "Number of layers (default: the model's)")->check(CLI::PositiveNumber);
  cmd->add_option("--dtype", o->dtype,
                  "Weight dtype: bf16, f32, or fp8 (e4m3 projections with 128x128 block scales). Default: fp8 for a "
                  "config with an fp8 quantization_config, else its torch_dtype (bf16 for every preset)")
      ->check(CLI::IsMember({"bf16", "f32", "fp8"}));
  cmd->add_option("--out", o->out, "Output folder")->required();
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  cmd->add_option("--shard-gb", o->shard_gb, "Largest shard, in GB")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--threads", o->threads,
                  "Threads generating and writing the weights (default: every core); the files are the same bytes "
                  "for any count")
      ->check(CLI::NonNegativeNumber);
  return {cmd, [o] { return run_synth(*o); }};
}

Command register_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "serve",
      "Serve the model over HTTP: sglang's /generate (log-probs for RL), the OpenAI API (/v1/completions, "
      "/v1/chat/completions, /v1/models), control (/health, /abort_request, /flush_cache, /pause_generation, "
      "/update_weights_from_disk) and /metrics. Under mpirun every rank holds its experts; rank 0 serves HTTP");
  auto o = std::make_shared<ServeCliOptions>();
  add_run_options(*cmd, o->run);
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "TCP port (0: any free port, printed at start)")->capture_default_str();
  cmd->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' on every endpoint but /health (401 otherwise)");
  cmd->add_option("--served-model-name", o->served_model_name,
                  "The model's name in the OpenAI API (default: the model folder's name)");
  cmd->add_option("--weight-version", o->weight_version, "The weight_version reported until weights are updated")
      ->capture_default_str();
  cmd->add_option("--max-batch-tokens", o->max_batch_tokens,
                  "Tokens one step feeds: running sequences' decode tokens first, then prompt chunks (chunked "
                  "prefill, so long prompts do not stall the streams in flight); 0: unlimited")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-running-requests", o->max_running_requests,
                  "Sequences in flight; more requests wait in the queue (0: unlimited)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache,
                "Compute every prompt in full instead of reusing cached KV blocks of earlier prompts (same bits)");
  cmd->add_option("--http-threads", o->http_threads,
                  "Connections served at once, one thread each (0: --max-running-requests + 32, at least 64)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-body-mb", o->max_body_mb, "Largest request body accepted, in MiB")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--enable-return-routed-experts", o->enable_routed_experts,
                "Accept return_routed_experts on /generate (sglang's routing replay for RL: meta_info.routed_experts, "
                "base64 of int32 [seq_len - 1, MoE layers, top_k]) and return_routed_expert_weights; such requests "
                "compute their whole prompt (no prefix cache). CPU only for now");
  cmd->add_option("--dp-attention", o->dp_attention,
                  "on: every rank serves its own requests (attention, dense layers, sampling, its KV pool), rank 0 "
                  "assigning each request to the least loaded rank, and the MoE layers run over all of them together "
                  "(sglang's --enable-dp-attention); off: rank 0 holds every request, the other ranks serve experts "
                  "only. The same bits either way")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--heartbeat", o->heartbeat,
                  "Seconds between the idle server's collectives (so a dead rank is found while idle too)")
      ->capture_default_str();
  return {cmd, [o] { return run_serve(*o); }};
}

}  // namespace

CommandLine parse_command_line(int argc, char** argv) {
  CLI::App app{
      "epmoe: Mixture-of-Experts inference from Hugging Face checkpoints, with expert parallelism over MPI.\n"
      "Run several ranks with: mpirun -np R epmoe <command> ... --moe-a2a-backend NAME"};
  app.require_subcommand(1);
  const std::vector<Command> commands = {register_info(app), register_score(app), register_generate(app),
                                         register_tokenize(app), register_check(app),
                                         register_synth(app), register_serve(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return {nullptr, rc == 0 ? 0 : 2};
  }
  for (auto& c : commands)
    if (c.app->parsed()) return {c.run, 0};
  return {nullptr, 2};  // require_subcommand(1) makes this unreachable
}

}  // namespace epmoe
