#include "kernels/cuda/split_linear.cuh"

#include "kernels/cuda/ops.cuh"

namespace epmoe::cuda {

namespace {

__global__ void split_rows_kernel(const float* x, int64_t lda, int64_t T, int K, int P, bool il64, bf16* out) {
  pdl_wait();  // (launched with launch_pdl: the GEMM after it requests its weights meanwhile)
  pdl_trigger();
  const int64_t n = T * K;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / K;
    const int k = int(i - t * K);
    const float v = x[t * lda + k];
    const bf16 hi = __float2bfloat16_rn(v);
    const bf16 lo = __float2bfloat16_rn(v - __bfloat162float(hi));
    bf16* row = out + t * P * K;
    if (il64) {  // [xh | xl] per 64 columns
      const int b = (k >> 6) << 7, o = k & 63;
      row[b + o] = hi;
      row[b + 64 + o] = lo;
    } else if (P == 2) {
      row[k] = hi;
      row[K + k] = lo;
    } else {
      row[k] = hi;
      row[K + k] = hi;
      row[2 * K + k] = lo;
    }
  }
}

// [N, K] bf16 -> [N, 2K] = [w | w], on the device.
__global__ void duplicate_rows_kernel(const bf16* w, int64_t N, int K, bf16* out) {
  const int64_t n = N * K;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / K;
    const int k = int(i - r * K);
    out[r * 2 * K + k] = w[i];
    out[r * 2 * K + K + k] = w[i];
  }
}

int blocks_for(int64_t n) { return int(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, int64_t(sm_count()) * 16))); }

}  // namespace

void SplitWeight::init(const std::vector<float>& wf, int N_, int K_) {
  bool exact = true;
  for (float v : wf) exact &= __bfloat162float(__float2bfloat16_rn(v)) == v;
  fill(wf, N_, K_, exact ? 2 : 3);
}

void SplitWeight::init3(const std::vector<float>& wf, int N_, int K_) { fill(wf, N_, K_, 3); }

void SplitWeight::fill(const std::vector<float>& wf, int N_, int K_, int P_) {
  N = N_, K = K_, P = P_;
  EPMOE_ASSERT(wf.size() == size_t(N) * size_t(K), "split weight: size");
  periodic = P == 2 && K % 64 == 0;
  if (periodic) {  // exactly bf16: the values themselves, once
    std::vector<bf16> h(wf.size());
    for (size_t i = 0; i < wf.size(); i++) h[i] = __float2bfloat16_rn(wf[i]);
    w.upload(h);
    return;
  }
  std::vector<bf16> h(size_t(N) * size_t(P) * size_t(K));
  for (int64_t r = 0; r < N; r++)
    for (int k = 0; k < K; k++) {
      const float v = wf[size_t(r) * size_t(K) + size_t(k)];
      const bf16 hi = __float2bfloat16_rn(v);
      const bf16 lo = __float2bfloat16_rn(v - __bfloat162float(hi));
      bf16* row = &h[size_t(r) * size_t(P) * size_t(K)];
      row[k] = hi;
      if (P == 2) {
        row[K + k] = hi;
      } else {
        row[K + k] = lo;
        row[2 * K + k] = hi;
      }
    }
  w.upload(h);
}

bf16* SplitWeight::alloc_periodic(int N_, int K_) {
  EPMOE_ASSERT(K_ % 64 == 0, "split weight: the periodic form needs K a multiple of 64, got " + std::to_string(K_));
  N = N_, K = K_, P = 2;
  periodic = true;
  w.reserve(size_t(N) * size_t(K));
  return w.data();
}

void SplitWeight::init_random(int N_, int K_, uint64_t seed, float scale, cudaStream_t s) {
  N = N_, K = K_, P = 2;
  periodic = K % 64 == 0;
  if (periodic) {
    w.reserve(size_t(N) * size_t(K));
    fill_random(w.data(), int64_t(N) * K, seed, scale, s);
    return;
  }
  DeviceArray<bf16> plain(size_t(N) * size_t(K));
  fill_random(plain.data(), int64_t(N) * K, seed, scale, s);
  w.reserve(size_t(N) * 2 * size_t(K));
  duplicate_rows_kernel<<<blocks_for(int64_t(N) * K), 256, 0, s>>>(plain.data(), N, K, w.data());
  EPMOE_CUDA_LAUNCHED();
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(s));  // `plain` is freed on return
}

void split_rows(const float* x, int64_t lda, int64_t T, int K, int P, DeviceArray<bf16>& out, cudaStream_t s,
                bool interleave64) {
  if (T == 0) return;
  EPMOE_ASSERT(!interleave64 || (P == 2 && K % 64 == 0), "split_rows: interleave64 needs P = 2 and K % 64 == 0");
  out.reserve(size_t(T) * size_t(P) * size_t(K));
  launch_pdl(split_rows_kernel, dim3(unsigned(blocks_for(T * K))), dim3(256), 0, s, x, lda, T, K, P, interleave64,
             out.data());
  EPMOE_CUDA_LAUNCHED();
}

void split_linear(const SplitWeight& W, const float* x, int64_t lda, int64_t T, DeviceArray<bf16>& xs, float* y,
                  const float* bias, Epilogue ep, cudaStream_t s, bool accumulate, bool x_split_given) {
  if (T == 0) return;
  if (split_gemv_fits(W, T)) return split_gemv(W, x, lda, T, y, bias, ep, s, accumulate, x_split_given);
  EPMOE_ASSERT(!x_split_given, "split_linear: x given split for a call split_gemv does not take");
  const int Kp = W.P * W.K;
  split_rows(x, lda, T, W.K, W.P, xs, s, W.periodic);
  GemmArgs g;
  g.A = xs.data();
  g.lda = Kp;
  g.accumulate = accumulate;
  g.B = W.w.data();
  g.ldb = W.periodic ? W.K : Kp;
  g.b_k_twice = W.periodic;
  g.M = int(T);
  g.N = W.N;
  g.K = Kp;
  g.C = y;
  g.ldc = ep == Epilogue::SwiGLU ? W.N / 2 : W.N;
  g.bias = bias;
  gemm<bf16, float>(g, ep, s);
}

void split_linear_grouped(const SplitWeight& W, int G, const float* x, int64_t lda, int64_t M, DeviceArray<bf16>& xs,
                          float* y, int64_t ldc, const int32_t* c_rows, cudaStream_t s) {
  if (M == 0) return;
  EPMOE_ASSERT(G >= 1 && W.N % G == 0, "split_linear_grouped: " + std::to_string(W.N) + " rows in " +
                                           std::to_string(G) + " groups");
  const int Kp = W.P * W.K;
  split_rows(x, lda, int64_t(G) * M, W.K, W.P, xs, s, W.periodic);
  GemmArgs g;
  g.A = xs.data();
  g.lda = Kp;
  g.B = W.w.data();
  g.ldb = W.periodic ? W.K : Kp;
  g.b_group_stride = int64_t(W.N / G) * g.ldb;
  g.b_k_twice = W.periodic;
  g.G = G;
  g.M = int(M);
  g.N = W.N / G;
  g.K = Kp;
  g.C = y;
  g.ldc = ldc;
  g.c_rows = c_rows;
  gemm<bf16, float>(g, Epilogue::Store, s);
}

}  // namespace epmoe::cuda
