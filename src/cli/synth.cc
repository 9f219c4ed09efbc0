// `epmoe synth`: a random checkpoint in the hub layout (config.json, sharded safetensors and
// model.safetensors.index.json) with the shapes of a real model, for benchmarks and for testing
// at scale without downloading anything. Weights are uniform with the std of the model's
// initializer_range, norms are 1: the numbers mean nothing, the shapes and bytes are real.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
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
#include "util/hash.h"

namespace epmoe {

namespace {

using nlohmann::json;

json preset(const std::string& like) {
  if (auto p = model_preset(like)) return *p;
  if (file_exists(like)) return read_json_file(like);
  throw InputError("--like '" + like +
                   "': neither a preset (qwen3-30b-a3b, qwen3-235b-a22b, qwen3-30b-a3b-fp8, deepseek-v2-lite, deepseek-v3, "
                   "glm-4.7-flash) nor a config.json file");
}

// What a tensor is filled with.
enum class Fill { Ones, Zeros, Uniform, Fp8Codes, Fp8Scale };

struct Planned {
  std::string name;
  std::vector<int64_t> shape;
  Fill fill;
  DType dtype;
  size_t bytes() const {
    size_t n = dtype_size(dtype);
    for (auto d : shape) n *= size_t(d);
    return n;
  }
};

// The tensors of the model, in the hub's names and order (per layer: attention, norms, MLP or
// MoE). Projections (2-D weights other than embeddings, lm_head and routers) are F8_E4M3 with a
// weight_scale_inv grid when the config has an fp8 quantization_config (scales in `scale_dtype`),
// unless modules_to_not_convert names them.
std::vector<Planned> plan_tensors(const ModelConfig& c, DType dt, DType scale_dtype) {
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size;
  const auto& keep = c.quant.modules_to_not_convert;
  std::vector<Planned> t;
  auto dense = [&](const std::string& name, int64_t rows, int64_t cols) {  // name without ".weight"
    const bool fp8 = c.quant.fp8 && std::find(keep.begin(), keep.end(), name) == keep.end();
    t.push_back({name + ".weight", {rows, cols}, fp8 ? Fill::Fp8Codes : Fill::Uniform, fp8 ? DType::F8_E4M3 : dt});
    if (fp8) {
      const int64_t b = c.quant.block;
      t.push_back({name + ".weight_scale_inv", {(rows + b - 1) / b, (cols + b - 1) / b}, Fill::Fp8Scale, scale_dtype});
    }
  };
  auto norm = [&](const std::string& name, int64_t n) { t.push_back({name, {n}, Fill::Ones, dt}); };
  auto swiglu = [&](const std::string& p, int64_t I) {
    dense(p + "gate_proj", I, H);
    dense(p + "up_proj", I, H);
    dense(p + "down_proj", H, I);
  };
  t.push_back({"model.embed_tokens.weight", {V, H}, Fill::Uniform, dt});
  for (int l = 0; l < c.num_layers; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    norm(p + "input_layernorm.weight", H);
    norm(p + "post_attention_layernorm.weight", H);
    const std::string a = p + "self_attn.";
    if (c.mla.enabled()) {
      const MlaConfig& m = c.mla;
      if (m.q_lora_rank > 0) {
        dense(a + "q_a_proj", m.q_lora_rank, H);
        norm(a + "q_a_layernorm.weight", m.q_lora_rank);
        dense(a + "q_b_proj", int64_t(c.num_heads) * m.qk_head_dim(), m.q_lora_rank);
      } else {
        dense(a + "q_proj", int64_t(c.num_heads) * m.qk_head_dim(), H);
      }
      dense(a + "kv_a_proj_with_mqa", m.kv_lora_rank + m.qk_rope_head_dim, H);
      norm(a + "kv_a_layernorm.weight", m.kv_lora_rank);
      dense(a + "kv_b_proj", int64_t(c.num_heads) * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank);
      dense(a + "o_proj", H, int64_t(c.num_heads) * m.v_head_dim);
    } else {
      dense(a + "q_proj", c.num_heads * D, H);
      dense(a + "k_proj", c.num_kv_heads * D, H);
      dense(a + "v_proj", c.num_kv_heads * D, H);
      dense(a + "o_proj", H, c.num_heads * D);
      if (c.qk_norm) {
        norm(a + "q_norm.weight", D);
        norm(a + "k_norm.weight", D);
      }
    }
    if (c.sparse_layer[size_t(l)]) {
      const int64_t I = c.moe_intermediate_size;
      t.push_back({p + "mlp.gate.weight", {c.routing.num_experts, H}, Fill::Uniform, dt});
      if (c.routing.has_correction_bias)
        t.push_back({p + "mlp.gate.e_score_correction_bias", {c.routing.num_experts}, Fill::Zeros, DType::F32});
      for (int e = 0; e < c.routing.num_experts; e++) swiglu(p + "mlp.experts." + std::to_string(e) + ".", I);
      if (c.shared_expert_gated) {  // Qwen2-MoE
        swiglu(p + "mlp.shared_expert.", c.shared_intermediate_size);
        t.push_back({p + "mlp.shared_expert_gate.weight", {1, H}, Fill::Uniform, dt});
      } else if (c.shared_intermediate_size > 0) {
        swiglu(p + "mlp.shared_experts.", c.shared_intermediate_size);
      }
    } else {
      swiglu(p + "mlp.", c.intermediate_size);
    }
  }
  norm("model.norm.weight", H);
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {V, H}, Fill::Uniform, dt});
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

// Values are drawn per chunk of kChunkValues values of a tensor, each chunk from a generator seeded
// by (seed, tensor name, chunk index): so the bytes are the same whatever the thread count, and an
// fp8 tensor's chunk draws the values of the bf16 tensor of the same name (--dtype fp8 quantizes
// the bf16 model of the same seed; the scale tensors in between shift no stream).
constexpr size_t kChunkValues = size_t(4) << 20;

uint64_t chunk_seed(uint64_t seed, const std::string& name, size_t chunk) {
  uint64_t h = splitmix64(seed);
  for (unsigned char ch : name) h = splitmix64(h ^ ch);
  return splitmix64(h ^ splitmix64(uint64_t(chunk)));
}

// Bytes written so far, on stderr: a bar on a terminal; otherwise a line each 10% (logs of long
// runs), each with the rate and the time left.
class Progress {
 public:
  explicit Progress(size_t total) : total_(total), tty_(isatty(STDERR_FILENO)), t0_(std::chrono::steady_clock::now()) {}
  void add(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    done_ += n;
    const int pct = total_ ? int(100.0 * double(done_) / double(total_)) : 100;
    if (pct == last_ || (!tty_ && pct / 10 == last_ / 10)) return;
    last_ = pct;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const double rate = s > 0 ? double(done_) / s : 0;
    const double eta = rate > 0 ? double(total_ - done_) / rate : 0;
    if (tty_) {
      char bar[41];
      for (int i = 0; i < 40; i++) bar[i] = i < pct * 40 / 100 ? '#' : ' ';
      bar[40] = 0;
      std::fprintf(stderr, "\r[%s] %3d%%  %.2f / %.2f GB  %.2f GB/s  %.0f s left ", bar, pct, double(done_) / 1e9,
                   double(total_) / 1e9, rate / 1e9, eta);
      if (done_ >= total_) std::fprintf(stderr, "\n");
    } else {
      std::fprintf(stderr, "epmoe synth: %3d%%  %.2f / %.2f GB  %.2f GB/s  %.0f s left\n", pct, double(done_) / 1e9,
                   double(total_) / 1e9, rate / 1e9, eta);
    }
    std::fflush(stderr);
  }

 private:
  std::mutex mu_;
  size_t total_, done_ = 0;
  bool tty_;
  int last_ = -1;
  std::chrono::steady_clock::time_point t0_;
};

// A file written at offsets by several threads (pwrite), closed on destruction.
class ShardFile {
 public:
  explicit ShardFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw InputError(path + ": cannot open for writing: " + std::strerror(errno));
  }
  ~ShardFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;
  void write_at(const void* data, size_t n, size_t off) const {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, p, n, off_t(off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw InputError(path_ + ": write failed at byte " + std::to_string(off) + ": " +
                                   (w < 0 ? std::strerror(errno) : "no space left?"));
      p += w, n -= size_t(w), off += size_t(w);
    }
  }
  void close() {
    if (::close(fd_) != 0) throw InputError(path_ + ": close failed: " + std::strerror(errno));
    fd_ = -1;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// One chunk of one tensor: values [first, first + count) of tensors[tensor], at byte `offset` of
// its shard.
struct Chunk {
  size_t shard, tensor, index, first, count, offset;
};

}  // namespace

int run_synth(const SynthOptions& o) {
  const auto t_start = std::chrono::steady_clock::now();
  json cfg = preset(o.like);
  if (o.layers > 0) {
    cfg["num_hidden_layers"] = o.layers;
    if (cfg.contains("max_window_layers")) cfg["max_window_layers"] = o.layers;
  }
  // Qwen's fp8 checkpoints carry bf16 scales and list modules_to_not_convert; DeepSeek's carry
  // fp32 scales. --dtype fp8 on a bf16 preset adds DeepSeek's quantization_config.
  const bool preset_fp8 = cfg.contains("quantization_config");
  const bool f32_config = cfg.value("torch_dtype", "") == "float32" || cfg.value("dtype", "") == "float32";
  const std::string dtype = !o.dtype.empty() ? o.dtype : preset_fp8 ? "fp8" : f32_config ? "f32" : "bf16";
  if (dtype == "fp8" && !preset_fp8)
    cfg["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                  {"weight_block_size", {128, 128}}};
  if (dtype != "fp8") cfg.erase("quantization_config");
  const DType dt = dtype == "f32" ? DType::F32 : DType::BF16;  // everything that is not fp8
  const DType scale_dt = cfg.contains("quantization_config") && cfg["quantization_config"].contains("modules_to_not_convert")
                             ? DType::BF16
                             : DType::F32;
  cfg["torch_dtype"] = dt == DType::BF16 ? "bfloat16" : "float32";
  const ModelConfig c = parse_model_config(cfg, o.like);  // validates, and gives the shapes
  const float std_dev = cfg.value("initializer_range", 0.02);
  const float scale = std_dev * std::sqrt(3.0f);  // uniform [-a, a] has std a / sqrt(3)
  // fp8: the weights the bf16 (or f32) model of the same seed holds, quantized as FP8 checkpoints
  // are made -- over one scale per block, rounded to the nearest e4m3 -- with the scale the fill's
  // bound / 448. So `--dtype fp8` and `--dtype bf16` give the same model at two precisions (a
  // Q8_0 GGUF of the bf16 one is then the same weights too), and the codes are distributed as in
  // real checkpoints: the e4m3 subnormals, which cost some CPUs a slow path, are as rare
  // (raw random bytes, as here before, made 1 in 16 codes subnormal).
  const float fp8_scale = scale / 448.0f;
  const float fp8_scale_stored = scale_dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(fp8_scale)) : fp8_scale;

  std::filesystem::create_directories(o.out);
  std::ofstream(o.out + "/config.json") << cfg.dump(2) << "\n";

  auto tensors = plan_tensors(c, dt, scale_dt);
  // Shards of at most shard_gb, tensors kept whole.
  std::vector<std::vector<size_t>> shards(1);
  size_t in_shard = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); i++) {
    const size_t b = tensors[i].bytes();
    if (in_shard > 0 && double(in_shard + b) > o.shard_gb * 1e9) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
    total += b;
  }
  json weight_map = json::object();
  std::vector<std::unique_ptr<ShardFile>> files;
  std::vector<Chunk> chunks;
  for (size_t s = 0; s < shards.size(); s++) {
    char fname[64];
    std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    std::vector<TensorLayout> layout;
    for (size_t i : shards[s]) {
      layout.push_back({tensors[i].name, tensors[i].dtype, tensors[i].shape});
      weight_map[tensors[i].name] = fname;
    }
    const std::string prefix = safetensors_prefix(layout, {{"format", "pt"}});
    files.push_back(std::make_unique<ShardFile>(o.out + "/" + fname));
    files.back()->write_at(prefix.data(), prefix.size(), 0);
    size_t pos = prefix.size();
    for (size_t i : shards[s]) {
      const size_t esz = dtype_size(tensors[i].dtype), values = tensors[i].bytes() / esz;
      for (size_t first = 0, c = 0; first < values; first += kChunkValues, c++) {
        const size_t count = std::min(kChunkValues, values - first);
        chunks.push_back({s, i, c, first, count, pos + first * esz});
      }
      pos += tensors[i].bytes();
    }
  }
  Progress progress(total);
  auto fill = [&](const Chunk& ch, std::vector<char>& buf) {
    const Planned& tp = tensors[ch.tensor];
    const size_t esz = dtype_size(tp.dtype);
    buf.resize(ch.count * esz);
    Rng rng(chunk_seed(o.seed, tp.name, ch.index));
    for (size_t j = 0; j < ch.count; j++) {
      if (tp.fill == Fill::Fp8Codes) {
        const float v = scale * rng.uniform();
        const float w = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : v;  // what the bf16 model stores
        buf[j] = char(f32_to_fp8e4m3(w / fp8_scale_stored));
        continue;
      }
      const float v = tp.fill == Fill::Ones       ? 1.0f
                      : tp.fill == Fill::Zeros    ? 0.0f
                      : tp.fill == Fill::Fp8Scale ? fp8_scale
                                                  : scale * rng.uniform();
      if (tp.dtype == DType::BF16) {
        const uint16_t b = f32_to_bf16(v);
        std::memcpy(&buf[j * 2], &b, 2);
      } else {
        std::memcpy(&buf[j * 4], &v, 4);
      }
    }
    files[ch.shard]->write_at(buf.data(), buf.size(), ch.offset);
    progress.add(buf.size());
  };
  // Chunks are taken in file order by every thread (one atomic counter), so the files grow
  // front to back; the first error stops the others and is rethrown here.
  const int nthreads = std::max(1, o.threads > 0 ? o.threads : int(std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
  auto worker = [&] {
    std::vector<char> buf;
    try {
      for (size_t c; !failed && (c = next++) < chunks.size();) fill(chunks[c], buf);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!failed.exchange(true)) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < nthreads; t++) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  for (auto& f : files) f->close();
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream(o.out + "/model.safetensors.index.json") << index.dump(2) << "\n";
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::printf("epmoe synth: %s, %d layers, %s, %.2f GB in %zu shard(s) -> %s (%.1f s, %.2f GB/s, %d threads)\n",
              o.like.c_str(), c.num_layers, dtype.c_str(), double(total) / 1e9, shards.size(), o.out.c_str(), secs,
              secs > 0 ? double(total) / 1e9 / secs : 0.0, nthreads);
  return 0;
}

}  // namespace epmoe
