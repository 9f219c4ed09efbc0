// `epmoe synth`: a random checkpoint in the hub layout (config.json, sharded safetensors and
// model.safetensors.index.json) with the shapes of a real model, for benchmarks and for testing
// at scale without downloading anything. Weights are uniform with the std of the model's
// initializer_range, norms are 1: the numbers mean nothing, the shapes and bytes are real.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "io/hf_config.h"
#include "io/model_presets.h"
#include "io/json_util.h"
#include "tensor/dtype.h"
#include "util/error.h"

namespace epmoe {

namespace {

using nlohmann::json;

json preset(const std::string& like) {
  if (auto p = model_preset(like)) return *p;
  if (file_exists(like)) return read_json_file(like);
  throw InputError("--like '" + like + "': neither a preset (qwen3-30b-a3b, qwen3-235b-a22b) nor a config.json file");
}

struct Planned {
  std::string name;
  std::vector<int64_t> shape;
  bool norm;  // filled with ones
  size_t bytes(size_t esz) const {
    size_t n = esz;
    for (auto d : shape) n *= size_t(d);
    return n;
  }
};

// The tensors of the model, in the hub's names and order (per layer: attention, norms, MoE).
std::vector<Planned> plan_tensors(const ModelConfig& c) {
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size;
  std::vector<Planned> t;
  t.push_back({"model.embed_tokens.weight", {V, H}, false});
  for (int l = 0; l < c.num_layers; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", {H}, true});
    t.push_back({p + "post_attention_layernorm.weight", {H}, true});
    t.push_back({p + "self_attn.q_proj.weight", {c.num_heads * D, H}, false});
    t.push_back({p + "self_attn.k_proj.weight", {c.num_kv_heads * D, H}, false});
    t.push_back({p + "self_attn.v_proj.weight", {c.num_kv_heads * D, H}, false});
    t.push_back({p + "self_attn.o_proj.weight", {H, c.num_heads * D}, false});
    if (c.qk_norm) {
      t.push_back({p + "self_attn.q_norm.weight", {D}, true});
      t.push_back({p + "self_attn.k_norm.weight", {D}, true});
    }
    if (c.sparse_layer[size_t(l)]) {
      const int64_t I = c.moe_intermediate_size;
      t.push_back({p + "mlp.gate.weight", {c.routing.num_experts, H}, false});
      for (int e = 0; e < c.routing.num_experts; e++) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        t.push_back({x + "gate_proj.weight", {I, H}, false});
        t.push_back({x + "up_proj.weight", {I, H}, false});
        t.push_back({x + "down_proj.weight", {H, I}, false});
      }
    } else {
      const int64_t I = c.intermediate_size;
      t.push_back({p + "mlp.gate_proj.weight", {I, H}, false});
      t.push_back({p + "mlp.up_proj.weight", {I, H}, false});
      t.push_back({p + "mlp.down_proj.weight", {H, I}, false});
    }
  }
  t.push_back({"model.norm.weight", {H}, true});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {V, H}, false});
  return t;
}

// xoshiro128+-style fast generator: gigabytes of weights in seconds.
struct Rng {
  uint64_t s0, s1;
  explicit Rng(uint64_t seed) : s0(seed * 0x9e3779b97f4a7c15ull + 1), s1(seed ^ 0xd1b54a32d192ed03ull) {}
  uint64_t next() {
    uint64_t a = s0, b = s1;
    s0 = b;
    a ^= a << 23;
    s1 = a ^ b ^ (a >> 17) ^ (b >> 26);
    return s1 + b;
  }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }  // [-1, 1)
};

class Progress {
 public:
  explicit Progress(size_t total) : total_(total), tty_(isatty(STDERR_FILENO)) {}
  void add(size_t n) {
    done_ += n;
    if (!tty_) return;
    const int pct = int(100.0 * double(done_) / double(total_));
    if (pct == last_) return;
    last_ = pct;
    char bar[41];
    for (int i = 0; i < 40; i++) bar[i] = i < pct * 40 / 100 ? '#' : ' ';
    bar[40] = 0;
    std::fprintf(stderr, "\r[%s] %3d%%  %.2f / %.2f GB", bar, pct, double(done_) / 1e9, double(total_) / 1e9);
    if (done_ >= total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  size_t total_, done_ = 0;
  bool tty_;
  int last_ = -1;
};

struct SynthOptions {
  std::string like;
  int layers = 0;
  std::string dtype = "bf16";
  std::string out;
  uint64_t seed = 0;
  double shard_gb = 5.0;
};

int run_synth(const SynthOptions& o) {
  json cfg = preset(o.like);
  if (o.layers > 0) {
    cfg["num_hidden_layers"] = o.layers;
    if (cfg.contains("max_window_layers")) cfg["max_window_layers"] = o.layers;
  }
  const DType dt = o.dtype == "bf16" ? DType::BF16 : DType::F32;
  cfg["torch_dtype"] = o.dtype == "bf16" ? "bfloat16" : "float32";
  const ModelConfig c = parse_model_config(cfg, o.like);  // validates, and gives the shapes
  const float std_dev = cfg.value("initializer_range", 0.02);
  const float scale = std_dev * std::sqrt(3.0f);  // uniform [-a, a] has std a / sqrt(3)

  std::filesystem::create_directories(o.out);
  std::ofstream(o.out + "/config.json") << cfg.dump(2) << "\n";

  const size_t esz = dtype_size(dt);
  auto tensors = plan_tensors(c);
  // Shards of at most shard_gb, tensors kept whole.
  std::vector<std::vector<size_t>> shards(1);
  size_t in_shard = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); i++) {
    const size_t b = tensors[i].bytes(esz);
    if (in_shard > 0 && double(in_shard + b) > o.shard_gb * 1e9) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
    total += b;
  }
  Progress progress(total);
  json weight_map = json::object();
  Rng rng(o.seed);
  std::vector<char> buf(16 << 20);
  for (size_t s = 0; s < shards.size(); s++) {
    char fname[64];
    std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    json header = json::object();
    header["__metadata__"] = {{"format", "pt"}};
    size_t off = 0;
    for (size_t i : shards[s]) {
      const size_t b = tensors[i].bytes(esz);
      header[tensors[i].name] = {{"dtype", std::string(dtype_name(dt))}, {"shape", tensors[i].shape},
                                 {"data_offsets", {off, off + b}}};
      weight_map[tensors[i].name] = fname;
      off += b;
    }
    std::string h = header.dump();
    while ((8 + h.size()) % 8) h.push_back(' ');
    std::ofstream f(o.out + "/" + fname, std::ios::binary);
    if (!f) throw InputError(o.out + "/" + fname + ": cannot open for writing");
    uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(h.data(), std::streamsize(h.size()));
    for (size_t i : shards[s]) {
      size_t left = tensors[i].bytes(esz) / esz;
      while (left) {
        const size_t chunk = std::min(left, buf.size() / esz);
        for (size_t j = 0; j < chunk; j++) {
          const float v = tensors[i].norm ? 1.0f : scale * rng.uniform();
          if (dt == DType::BF16) {
            const uint16_t b = f32_to_bf16(v);
            std::memcpy(&buf[j * 2], &b, 2);
          } else {
            std::memcpy(&buf[j * 4], &v, 4);
          }
        }
        f.write(buf.data(), std::streamsize(chunk * esz));
        progress.add(chunk * esz);
        left -= chunk;
      }
    }
    if (!f) throw InputError(o.out + "/" + fname + ": write failed (disk full?)");
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream(o.out + "/model.safetensors.index.json") << index.dump(2) << "\n";
  std::printf("epmoe synth: %s, %d layers, %.2f GB in %zu shard(s) -> %s\n", o.like.c_str(), c.num_layers,
              double(total) / 1e9, shards.size(), o.out.c_str());
  return 0;
}

}  // namespace

Command register_synth(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "synth", "Write a random checkpoint with a real model's shapes (hub layout, sharded) for benchmarks");
  auto o = std::make_shared<SynthOptions>();
  cmd->add_option("--like", o->like, "qwen3-30b-a3b, qwen3-235b-a22b, or a config.json to copy")->required();
  cmd->add_option("--layers", o->layers, "Number of layers (default: the model's)")->check(CLI::PositiveNumber);
  cmd->add_option("--dtype", o->dtype, "Weight dtype")->check(CLI::IsMember({"bf16", "f32"}))->capture_default_str();
  cmd->add_option("--out", o->out, "Output folder")->required();
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  cmd->add_option("--shard-gb", o->shard_gb, "Largest shard, in GB")->check(CLI::PositiveNumber)->capture_default_str();
  return {cmd, [o] { return run_synth(*o); }};
}

}  // namespace epmoe
