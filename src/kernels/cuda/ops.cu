#include "kernels/cuda/ops.cuh"

#include "util/env.h"

namespace epmoe::cuda {

namespace {

// res.routed: first x[t] += the MoE output (residual_rmsnorm; rows is then nullptr). Each thread
// writes and then reads back its own elements i = tid, tid + 256, ...: no barrier needed.
template <class TA>
__global__ void rmsnorm_kernel(const float* x, const float* w, float eps, int H, const int32_t* rows, float* of,
                               TA* oa, const MoeResidual res, int T, const XFragments xo) {
  __shared__ float scratch[32];
  pdl_wait();  // (launched with launch_pdl)
  pdl_trigger();
  const int64_t t = blockIdx.x;
  if (t >= T) return zero_fragment_row(xo, int(t), H);  // (blocks past T: xo's zero rows)
  const float* r = x + (rows ? int64_t(rows[t]) : t) * H;
  if (res.routed) {
    float* xr = const_cast<float*>(r);
    for (int i = threadIdx.x; i < H; i += blockDim.x) xr[i] = xr[i] + moe_residual_value(res, t * H + i, H);
  }
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) ss += r[i] * r[i];
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(H) + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    const float v = w[i] * (r[i] * inv);
    if (of) of[t * H + i] = v;
    if (oa) oa[t * H + i] = from_f32<TA>(v);
    if (xo.xf) store_fragment_pair(xo, int(t), i, v, H);
  }
}

// rmsnorm_kernel with the row in registers, for H <= 256 C: each thread loads its elements
// i = tid + 256 c once, the norm weight's before the wait (a weight depends on no kernel), so a
// launch is one dependent trip to memory instead of three (load and add, read back for the sum,
// read back for the output: ~6.8 us of a one-sequence decode step's chain per norm, run 22's
// kernel timeline). The same arithmetic in the same order per thread and the same block_sum, so
// the same bits (GpuOps.RmsnormRegistersKeepTheLoopKernelsBits).
template <class TA, int C>
__global__ void __launch_bounds__(256) rmsnorm_regs_kernel(const float* x, const float* w, float eps, int H,
                                                            const int32_t* rows, float* of, TA* oa,
                                                            const MoeResidual res, int T, const XFragments xo) {
  __shared__ float scratch[32];
  float wv[C], v[C];
#pragma unroll
  for (int c = 0; c < C; c++) {
    const int i = threadIdx.x + 256 * c;
    wv[c] = i < H ? w[i] : 0.f;
  }
  pdl_wait();  // (launched with launch_pdl)
  pdl_trigger();
  const int64_t t = blockIdx.x;
  if (t >= T) return zero_fragment_row(xo, int(t), H);  // (blocks past T: xo's zero rows)
  const float* r = x + (rows ? int64_t(rows[t]) : t) * H;
#pragma unroll
  for (int c = 0; c < C; c++) {
    const int i = threadIdx.x + 256 * c;
    v[c] = i < H ? r[i] : 0.f;
  }
  if (res.routed) {
    // Every MoE value is loaded before the first store to x: x may alias them for all the compiler
    // knows, so a load after a store stays after it, and the store waits for its own sum -- loads
    // and stores interleaved made C dependent trips to L2 out of one.
    float m[C];
#pragma unroll
    for (int c = 0; c < C; c++) {
      const int i = threadIdx.x + 256 * c;
      m[c] = i < H ? moe_residual_value(res, t * H + i, H) : 0.f;
    }
    float* xr = const_cast<float*>(r);
#pragma unroll
    for (int c = 0; c < C; c++) {
      const int i = threadIdx.x + 256 * c;
      if (i < H) {
        v[c] = v[c] + m[c];
        xr[i] = v[c];
      }
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < C; c++)
    if (threadIdx.x + 256 * c < H) ss += v[c] * v[c];
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(H) + eps);
#pragma unroll
  for (int c = 0; c < C; c++) {
    const int i = threadIdx.x + 256 * c;
    if (i >= H) break;
    const float o = wv[c] * (v[c] * inv);
    if (of) of[t * H + i] = o;
    if (oa) oa[t * H + i] = from_f32<TA>(o);
    if (xo.xf) store_fragment_pair(xo, int(t), i, o, H);
  }
}

// The norm of T rows: with `regs`, the register kernel for rows of up to 4096 (every model here
// but DeepSeek-V3's 7168); the loop kernel otherwise. 256 threads either way (the sum's tree).
// With xo, xo.rows blocks at least (the ones past T write zero rows).
template <class TA>
void launch_rmsnorm(const float* x, const float* w, float eps, int64_t T, int H, const int32_t* rows, float* of,
                    TA* oa, const MoeResidual& res, cudaStream_t s, bool regs, const XFragments& xo) {
  EPMOE_ASSERT(!xo.xf || (H % 64 == 0 && (xo.rows == 8 || xo.rows == 16) && T <= xo.rows && !rows),
               "rmsnorm: x fragments need H % 64 == 0, 8 or 16 fragment rows >= T and no row selection (H " +
                   std::to_string(H) + ", T " + std::to_string(T) + ", rows " + std::to_string(xo.rows) + ")");
  const dim3 grid{unsigned(xo.xf ? std::max<int64_t>(T, xo.rows) : T)}, block{256u};
  const int t = int(T);
  if (!regs || H > 4096) launch_pdl(rmsnorm_kernel<TA>, grid, block, 0, s, x, w, eps, H, rows, of, oa, res, t, xo);
  else if (H <= 1024) launch_pdl(rmsnorm_regs_kernel<TA, 4>, grid, block, 0, s, x, w, eps, H, rows, of, oa, res, t, xo);
  else if (H <= 2048) launch_pdl(rmsnorm_regs_kernel<TA, 8>, grid, block, 0, s, x, w, eps, H, rows, of, oa, res, t, xo);
  else launch_pdl(rmsnorm_regs_kernel<TA, 16>, grid, block, 0, s, x, w, eps, H, rows, of, oa, res, t, xo);
  EPMOE_CUDA_LAUNCHED();
}

// The register kernel unless EPMOE_RMSNORM_REGS=0 (run 23, H100, 48 layers: one sequence 6.10 ->
// 5.67 ms a token, 8 sequences 13.24 -> 12.86; GpuOps.RmsnormRegistersKeepTheLoopKernelsBits).
bool rmsnorm_regs() {
  static const bool on = !env_off("EPMOE_RMSNORM_REGS");
  return on;
}

template <class TW>
__global__ void embed_kernel(const int32_t* ids, const TW* table, int H, float* out) {
  pdl_wait();  // (launched with launch_pdl)
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const TW* row = table + int64_t(ids[t]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) out[t * H + i] = to_f32(row[i]);
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  pdl_wait();  // (launched with launch_pdl)
  pdl_trigger();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

template <class TO>
__global__ void convert_kernel(const float* in, TO* out, int64_t n) {
  pdl_wait();  // (launched with launch_pdl)
  pdl_trigger();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<TO>(in[i]);
}

template <class T>
__global__ void fill_random_kernel(T* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64(seed * 0x100000001b3ull + uint64_t(i));
    const float u = float(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = from_f32<T>((2.0f * u - 1.0f) * scale);
  }
}

}  // namespace

// The norm and decode attention write split_gemv's x fragments unless EPMOE_NORM_SPLITS=0 (run 23,
// H100, 48 layers: one sequence 6.10 -> 6.00 ms a token, 8 sequences 13.24 -> 13.12; with the
// register norm 5.60 and 12.73; GpuOps.NormWritesSplitGemvFragments checks the bits).
bool norm_splits() {
  static const bool on = !env_off("EPMOE_NORM_SPLITS");
  return on;
}

template <class TA>
void rmsnorm(const float* x, const float* w, float eps, int64_t T, int H, const int32_t* rows, float* out_f32,
             TA* out_act, cudaStream_t s, const XFragments& xo) {
  if (T == 0) return;
  launch_rmsnorm<TA>(x, w, eps, T, H, rows, out_f32, out_act, MoeResidual{}, s, rmsnorm_regs(), xo);
}
template void rmsnorm<float>(const float*, const float*, float, int64_t, int, const int32_t*, float*, float*, cudaStream_t,
                             const XFragments&);
template void rmsnorm<bf16>(const float*, const float*, float, int64_t, int, const int32_t*, float*, bf16*, cudaStream_t,
                            const XFragments&);

template <class TA>
void residual_rmsnorm(float* x, const MoeResidual& m, const float* w, float eps, int64_t T, int H, float* out_f32,
                      TA* out_act, cudaStream_t s, const XFragments& xo) {
  if (T == 0) return;
  EPMOE_ASSERT(m.routed, "residual_rmsnorm: no MoE output to add");
  launch_rmsnorm<TA>(x, w, eps, T, H, nullptr, out_f32, out_act, m, s, rmsnorm_regs(), xo);
}
template void residual_rmsnorm<float>(float*, const MoeResidual&, const float*, float, int64_t, int, float*, float*,
                                      cudaStream_t, const XFragments&);
template void residual_rmsnorm<bf16>(float*, const MoeResidual&, const float*, float, int64_t, int, float*, bf16*,
                                     cudaStream_t, const XFragments&);

template <class TA>
void rmsnorm_on_kernel(bool registers, float* x, const MoeResidual& m, const float* w, float eps, int64_t T, int H,
                       const int32_t* rows, float* out_f32, TA* out_act, cudaStream_t s, const XFragments& xo) {
  if (T == 0) return;
  launch_rmsnorm<TA>(x, w, eps, T, H, rows, out_f32, out_act, m, s, registers, xo);
}
template void rmsnorm_on_kernel<float>(bool, float*, const MoeResidual&, const float*, float, int64_t, int,
                                       const int32_t*, float*, float*, cudaStream_t, const XFragments&);
template void rmsnorm_on_kernel<bf16>(bool, float*, const MoeResidual&, const float*, float, int64_t, int,
                                      const int32_t*, float*, bf16*, cudaStream_t, const XFragments&);

template <class TW>
void embed(const int32_t* ids, const TW* table, int64_t T, int H, float* out, cudaStream_t s) {
  if (T == 0) return;
  launch_pdl(embed_kernel<TW>, dim3(unsigned(T)), dim3(256), 0, s, ids, table, H, out);
  EPMOE_CUDA_LAUNCHED();
}
template void embed<float>(const int32_t*, const float*, int64_t, int, float*, cudaStream_t);
template void embed<bf16>(const int32_t*, const bf16*, int64_t, int, float*, cudaStream_t);

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch_pdl(add_kernel, dim3(unsigned(grid_for(n))), dim3(256), 0, s, x, y, n);
  EPMOE_CUDA_LAUNCHED();
}

template <class TO>
void convert(const float* in, TO* out, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch_pdl(convert_kernel<TO>, dim3(unsigned(grid_for(n))), dim3(256), 0, s, in, out, n);
  EPMOE_CUDA_LAUNCHED();
}
template void convert<float>(const float*, float*, int64_t, cudaStream_t);
template void convert<bf16>(const float*, bf16*, int64_t, cudaStream_t);

template <class T>
void fill_random(T* p, int64_t n, uint64_t seed, float scale, cudaStream_t s) {
  if (n == 0) return;
  fill_random_kernel<T><<<grid_for(n), 256, 0, s>>>(p, n, seed, scale);
  EPMOE_CUDA_LAUNCHED();
}
template void fill_random<float>(float*, int64_t, uint64_t, float, cudaStream_t);
template void fill_random<bf16>(bf16*, int64_t, uint64_t, float, cudaStream_t);

}  // namespace epmoe::cuda
