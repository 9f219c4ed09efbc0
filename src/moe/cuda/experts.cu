#include "moe/cuda/experts.cuh"

#include "kernels/cuda/ops.cuh"
#include "util/env.h"

#include <cstring>
#include <type_traits>

namespace epmoe::cuda {

// A decode step's jobs run without a plan up to this many (token, slot) pairs: EPMOE_PLANLESS_JOBS
// (0: always plan). Past a few tokens, two jobs of one expert read its weights twice where the plan
// gives them one tile.
int planless_jobs_default() {
  static const int n = env_int("EPMOE_PLANLESS_JOBS", 16);
  return n;
}

bool fused_combine_default() {
  static const bool on = !env_off("EPMOE_FUSED_COMBINE");
  return on;
}

template <class T>
bool ExpertRunnerGpu<T>::planless(const ExpertJobs& j) const {
  return std::is_same_v<T, bf16> && j.rows > 0 && j.rows * j.K <= planless_jobs_ && !j.compact && !j.one_per_row &&
         !j.rows_dev && !j.row_base && j.phys_stride == j.K && w_.n_local > 0;
}

template <class T>
bool ExpertRunnerGpu<T>::run_and_combine(const ExpertJobs& j, void* out, const float* w, float* y) {
  if (!fused_combine_ || !planless(j)) return false;
  run_jobs(j, out, w, y);
  return true;
}

template <class T>
void ExpertRunnerGpu<T>::run_gemms(GemmArgs g1, GemmArgs g2, const ExpertJobs& j, void* out) {
  h_.reserve(size_t(j.rows * j.K) * size_t(w_.I));
  g1.A = j.x;
  g1.lda = j.x_stride;
  g1.B = w_.w1.data();
  g1.ldb = w_.H;
  g1.b_group_stride = int64_t(2) * w_.I * w_.H;
  g1.N = 2 * w_.I;
  g1.K = w_.H;
  g1.C = h_.data();
  g1.ldc = w_.I;
  gemm<T, T>(g1, Epilogue::SwiGLU, stream());
  g2.A = h_.data();
  g2.lda = w_.I;
  g2.B = w_.w2.data();
  g2.ldb = w_.I;
  g2.b_group_stride = int64_t(w_.H) * w_.I;
  g2.N = w_.H;
  g2.K = w_.I;
  g2.C = out;
  g2.ldc = w_.H;
  g2.plan_precedes_a = true;  // g1 waited for the plan (or the routing) before letting g2 start
  gemm<T, T>(g2, Epilogue::Store, stream());
}

template <class T>
void ExpertRunnerGpu<T>::run_jobs(const ExpertJobs& j, void* out, const float* w, float* y) {
  // Job g = (token g / K, slot g % K): its h row is g, its output row g = t * K + k (token_jobs).
  GemmArgs g1, g2;
  for (GemmArgs* g : {&g1, &g2}) {
    g->G = int(j.rows * j.K);
    g->M = 1;
    g->job_expert = j.phys;
    g->job_expert_base = w_.p0;
    g->job_experts = w_.n_local;
  }
  g1.job_a_div = j.K;  // (g2's A row is h's row g)
  if (y) {
    // A counter per (token, 32-column tile), zeroed once: every launch leaves them at zero.
    const size_t counters = size_t(j.rows) * size_t(ceil_div(w_.H, 32));
    if (row_sum_counters_.capacity() < counters) {
      row_sum_counters_.reserve(counters);
      EPMOE_CUDA_CHECK(cudaMemsetAsync(row_sum_counters_.data(), 0, counters * sizeof(int32_t), stream()));
    }
    g2.row_sum_rows = j.K;
    g2.row_sum_w = w;
    g2.row_sum_out = y;
    g2.row_sum_ld = w_.H;
    g2.row_sum_counters = row_sum_counters_.data();
  }
  run_gemms(g1, g2, j, out);
}

template <class T>
void ExpertRunnerGpu<T>::run(const ExpertJobs& j, void* out) {
  if (planless(j)) return run_jobs(j, out);
  // bf16: one CTA per (m-tile, N-tile), from a tile list the plan writes.
  if (!plan_.make(j, w_.p0, w_.n_local, std::is_same_v<T, bf16>)) return;
  GemmArgs g1, g2;
  plan_.apply(g1, w_.n_local);
  plan_.apply(g2, w_.n_local);
  g1.a_rows = plan_.a_rows.data();
  g2.c_rows = plan_.c_rows.data();
  run_gemms(g1, g2, j, out);
}
template class ExpertRunnerGpu<float>;
template class ExpertRunnerGpu<bf16>;

void SplitExpertRunner::upload(int q, const std::vector<float>& gate_up, const std::vector<float>& down) {
  SplitWeight a, b;
  a.init3(gate_up, 2 * I, H);
  b.init3(down, H, I);
  const size_t n1 = size_t(2 * I) * 3 * size_t(H), n2 = size_t(H) * 3 * size_t(I);
  EPMOE_CUDA_CHECK(cudaMemcpy(w1.data() + size_t(q) * n1, a.w.data(), n1 * sizeof(bf16), cudaMemcpyDeviceToDevice));
  EPMOE_CUDA_CHECK(cudaMemcpy(w2.data() + size_t(q) * n2, b.w.data(), n2 * sizeof(bf16), cudaMemcpyDeviceToDevice));
}

void SplitExpertRunner::run(const ExpertJobs& j, void* out) {
  if (!plan_.make(j, p0, n_local, /*tiled=*/true)) return;
  const int64_t cap = j.rows * j.K;
  h_.reserve(size_t(cap) * size_t(I));
  // Every source row is split (rows beyond a round's device count are never read by the GEMM).
  split_rows(static_cast<const float*>(j.x), j.x_stride, j.rows, H, 3, xs_, stream());
  GemmArgs g1;
  plan_.apply(g1, n_local);
  g1.A = xs_.data();
  g1.lda = 3 * H;
  g1.a_rows = plan_.a_rows.data();
  g1.B = w1.data();
  g1.ldb = 3 * H;
  g1.b_group_stride = int64_t(2) * I * 3 * H;
  g1.N = 2 * I;
  g1.K = 3 * H;
  g1.C = h_.data();
  g1.ldc = I;
  gemm<bf16, float>(g1, Epilogue::SwiGLU, stream());
  // h rows are in job order (row r of the plan), so they split as they are.
  split_rows(h_.data(), I, cap, I, 3, hs_, stream());
  GemmArgs g2;
  plan_.apply(g2, n_local);
  g2.A = hs_.data();
  g2.lda = 3 * I;
  g2.B = w2.data();
  g2.ldb = 3 * I;
  g2.b_group_stride = int64_t(H) * 3 * I;
  g2.N = H;
  g2.K = 3 * I;
  g2.C = out;
  g2.ldc = H;
  g2.c_rows = plan_.c_rows.data();
  gemm<bf16, float>(g2, Epilogue::Store, stream());
}

void Fp8ExpertRunner::init(int H_, int I_, int p0_, int n_local_) {
  H = H_, I = I_, p0 = p0_, n_local = n_local_;
  Hp = fp8_padded(H), Ip = fp8_padded(I);
  const size_t n = size_t(std::max(n_local, 0));
  w1.reserve(n * size_t(2 * I) * size_t(Hp));
  s1.reserve(n * size_t(Hp / kFp8Block) * size_t(2 * I));
  w2.reserve(n * size_t(H) * size_t(Ip));
  s2.reserve(n * size_t(Ip / kFp8Block) * size_t(H));
}

size_t Fp8ExpertRunner::expert_bytes() const {
  return size_t(2 * I) * size_t(Hp) + size_t(H) * size_t(Ip) +
         sizeof(float) * (size_t(Hp / kFp8Block) * size_t(2 * I) + size_t(Ip / kFp8Block) * size_t(H));
}

bool Fp8ExpertRunner::accepts(const TensorView& t) {
  return t.dtype == DType::F8_E4M3 && t.rank() == 2 && !t.scale.empty() && t.scale.block == kFp8Block;
}

void Fp8ExpertRunner::upload(int q, const TensorView& gate, const TensorView& up, const TensorView& down) {
  for (const TensorView* t : {&gate, &up, &down})
    EPMOE_ASSERT(accepts(*t), "fp8 experts: " + t->name + " is not an F8_E4M3 weight with 128-blocks of scales");
  EPMOE_ASSERT(gate.shape[0] == I && gate.shape[1] == H && up.shape == gate.shape && down.shape[0] == H &&
                   down.shape[1] == I,
               "fp8 experts: shapes of " + gate.name);
  EPMOE_ASSERT(q >= 0 && q < n_local, "fp8 experts: expert index");
  const int HB = Hp / kFp8Block, IB = Ip / kFp8Block;
  // Codes row by row into zero-padded rows; scales expanded per row, k-block-major.
  std::vector<uint8_t> c1(size_t(2 * I) * size_t(Hp), 0), c2(size_t(H) * size_t(Ip), 0);
  std::vector<float> f1(size_t(HB) * size_t(2 * I)), f2(size_t(IB) * size_t(H));
  const auto* g = static_cast<const uint8_t*>(gate.data);
  const auto* u = static_cast<const uint8_t*>(up.data);
  const auto* d = static_cast<const uint8_t*>(down.data);
  for (int j = 0; j < I; j++) {
    std::memcpy(&c1[size_t(2 * j) * size_t(Hp)], g + size_t(j) * size_t(H), size_t(H));
    std::memcpy(&c1[size_t(2 * j + 1) * size_t(Hp)], u + size_t(j) * size_t(H), size_t(H));
    for (int b = 0; b < HB; b++) {
      f1[size_t(b) * size_t(2 * I) + size_t(2 * j)] = gate.scale.at(j, int64_t(b) * kFp8Block);
      f1[size_t(b) * size_t(2 * I) + size_t(2 * j + 1)] = up.scale.at(j, int64_t(b) * kFp8Block);
    }
  }
  for (int r = 0; r < H; r++) {
    std::memcpy(&c2[size_t(r) * size_t(Ip)], d + size_t(r) * size_t(I), size_t(I));
    for (int b = 0; b < IB; b++) f2[size_t(b) * size_t(H) + size_t(r)] = down.scale.at(r, int64_t(b) * kFp8Block);
  }
  EPMOE_CUDA_CHECK(cudaMemcpy(w1.data() + size_t(q) * c1.size(), c1.data(), c1.size(), cudaMemcpyHostToDevice));
  EPMOE_CUDA_CHECK(cudaMemcpy(w2.data() + size_t(q) * c2.size(), c2.data(), c2.size(), cudaMemcpyHostToDevice));
  EPMOE_CUDA_CHECK(cudaMemcpy(s1.data() + size_t(q) * f1.size(), f1.data(), f1.size() * sizeof(float),
                              cudaMemcpyHostToDevice));
  EPMOE_CUDA_CHECK(cudaMemcpy(s2.data() + size_t(q) * f2.size(), f2.data(), f2.size() * sizeof(float),
                              cudaMemcpyHostToDevice));
}

void Fp8ExpertRunner::run(const ExpertJobs& j, void* out) {
  if (!plan_.make(j, p0, n_local, /*tiled=*/true)) return;
  const int64_t cap = j.rows * j.K;
  const int HB = Hp / kFp8Block, IB = Ip / kFp8Block;
  xq_.reserve(size_t(j.rows) * size_t(Hp));
  xs_.reserve(size_t(j.rows) * size_t(HB));
  h_.reserve(size_t(cap) * size_t(I));
  hq_.reserve(size_t(cap) * size_t(Ip));
  hs_.reserve(size_t(cap) * size_t(IB));
  // Every source row is quantized (rows beyond a round's device count are never read by the GEMM).
  quantize_rows_fp8(static_cast<const float*>(j.x), j.x_stride, j.rows, j.rows_dev, H, xq_.data(), Hp, xs_.data(),
                    HB, stream());
  Fp8GemmArgs g1;
  plan_.apply(g1.g, n_local);
  g1.g.A = xq_.data();
  g1.g.lda = Hp;
  g1.g.a_rows = plan_.a_rows.data();
  g1.g.B = w1.data();
  g1.g.ldb = Hp;
  g1.g.b_group_stride = int64_t(2) * I * Hp;
  g1.g.N = 2 * I;
  g1.g.K = Hp;
  g1.g.C = h_.data();
  g1.g.ldc = I;
  g1.a_scale = xs_.data();
  g1.a_scale_ld = HB;
  g1.b_scale = s1.data();
  g1.b_scale_group_stride = int64_t(HB) * 2 * I;
  gemm_fp8(g1, Epilogue::SwiGLU, stream());
  // h rows are in job order (row r of the plan); only the plan's rows (offsets[n_local]) exist.
  quantize_rows_fp8(h_.data(), I, cap, plan_.offsets.data() + n_local, I, hq_.data(), Ip, hs_.data(), IB, stream());
  Fp8GemmArgs g2;
  plan_.apply(g2.g, n_local);
  g2.g.A = hq_.data();
  g2.g.lda = Ip;
  g2.g.B = w2.data();
  g2.g.ldb = Ip;
  g2.g.b_group_stride = int64_t(H) * Ip;
  g2.g.N = H;
  g2.g.K = Ip;
  g2.g.C = out;
  g2.g.ldc = H;
  g2.g.c_rows = plan_.c_rows.data();
  g2.a_scale = hs_.data();
  g2.a_scale_ld = IB;
  g2.b_scale = s2.data();
  g2.b_scale_group_stride = int64_t(IB) * H;
  gemm_fp8(g2, Epilogue::Store, stream());
}

namespace {

__global__ void moe_output_kernel(const MoeResidual m, int64_t T, int H, float* out, bool accumulate) {
  pdl_wait();  // (launched with launch_pdl)
  pdl_trigger();
  const int64_t n = T * H;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = moe_residual_value(m, i, H);
    out[i] = accumulate ? out[i] + v : v;
  }
}

}  // namespace

void moe_output(const float* routed, const float* shared, const float* gate_logit, int64_t T, int H, float* out,
                bool accumulate, cudaStream_t s) {
  if (T == 0) return;
  launch_pdl(moe_output_kernel, dim3(unsigned(grid_for(T * H))), dim3(256), 0, s, MoeResidual{routed, shared, gate_logit},
             T, H, out, accumulate);
  EPMOE_CUDA_LAUNCHED();
}

}  // namespace epmoe::cuda
