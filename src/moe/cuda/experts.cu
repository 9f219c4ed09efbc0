#include "moe/cuda/experts.cuh"

#include <type_traits>

namespace epmoe::cuda {

template <class T>
void ExpertRunnerGpu<T>::run(const ExpertJobs& j, void* out) {
  // bf16: one CTA per (m-tile, N-tile), from a tile list the plan writes.
  if (!plan_.make(j, w_.p0, w_.n_local, std::is_same_v<T, bf16>)) return;
  h_.reserve(size_t(j.rows * j.K) * size_t(w_.I));
  GemmArgs g1;
  plan_.apply(g1, w_.n_local);
  g1.A = j.x;
  g1.lda = j.x_stride;
  g1.a_rows = plan_.a_rows.data();
  g1.B = w_.w1.data();
  g1.ldb = w_.H;
  g1.b_group_stride = int64_t(2) * w_.I * w_.H;
  g1.N = 2 * w_.I;
  g1.K = w_.H;
  g1.C = h_.data();
  g1.ldc = w_.I;
  gemm<T, T>(g1, Epilogue::SwiGLU, stream());
  GemmArgs g2;
  plan_.apply(g2, w_.n_local);
  g2.A = h_.data();
  g2.lda = w_.I;
  g2.B = w_.w2.data();
  g2.ldb = w_.I;
  g2.b_group_stride = int64_t(w_.H) * w_.I;
  g2.N = w_.H;
  g2.K = w_.I;
  g2.C = out;
  g2.ldc = w_.H;
  g2.c_rows = plan_.c_rows.data();
  gemm<T, T>(g2, Epilogue::Store, stream());
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

namespace {

__global__ void moe_output_kernel(const float* routed, const float* shared, const float* gate, int64_t T, int H,
                                  float* out, bool accumulate) {
  const int64_t n = T * H;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = routed[i];
    if (shared) {
      const float g = gate ? 1.0f / (1.0f + expf(-gate[i / H])) : 1.0f;
      v += g * shared[i];
    }
    out[i] = accumulate ? out[i] + v : v;
  }
}

}  // namespace

void moe_output(const float* routed, const float* shared, const float* gate_logit, int64_t T, int H, float* out,
                bool accumulate, cudaStream_t s) {
  if (T == 0) return;
  moe_output_kernel<<<grid_for(T * H), 256, 0, s>>>(routed, shared, gate_logit, T, H, out, accumulate);
  EPMOE_CUDA_LAUNCHED();
}

}  // namespace epmoe::cuda
