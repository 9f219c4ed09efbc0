#include "model/cuda/attention.cuh"

namespace epmoe::cuda {

namespace {

// Offset of position j's row (layer `layer`) in the K or V pool, through the sequence's block table.
__device__ __forceinline__ int64_t kv_row(const KvPages& kv, const int32_t* table, int layer, int j, int64_t kvd) {
  const int B = kv.block_tokens;
  return ((int64_t(layer) * kv.blocks + table[j / B]) * B + j % B) * kvd;
}

// One warp per (token, head) over the q heads, then the k heads, then the v heads.
__global__ void rope_kernel(const RopeArgs a) {
  extern __shared__ float hsm[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int heads = a.Hq + 2 * a.Hkv, D = a.D;
  const int64_t job = int64_t(blockIdx.x) * nw + warp;
  if (job >= a.T * heads) return;
  const int64_t t = job / heads;
  const int h = int(job % heads);
  float* s = hsm + size_t(warp) * D;
  const float* src = a.qkv + t * int64_t(heads) * D + int64_t(h) * D;
  const TokenSlot slot = a.slots[t];
  const int64_t kvd = int64_t(a.Hkv) * D;
  const int64_t row = h >= a.Hq ? kv_row(a.kv, a.kv.tables + slot.table, a.layer, slot.pos, kvd) : 0;
  if (h >= a.Hq + a.Hkv) {  // v: straight into the cache
    float* dst = a.kv.v + row + int64_t(h - a.Hq - a.Hkv) * D;
    for (int i = lane; i < D; i += 32) dst[i] = src[i];
    return;
  }
  const bool is_q = h < a.Hq;
  const float* nw_ = is_q ? a.q_norm : a.k_norm;
  for (int i = lane; i < D; i += 32) s[i] = src[i];
  __syncwarp();
  if (nw_) {
    float ss = 0.f;
    for (int i = lane; i < D; i += 32) ss += s[i] * s[i];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / float(D) + a.eps);
    for (int i = lane; i < D; i += 32) s[i] = nw_[i] * (s[i] * inv);
    __syncwarp();
  }
  float* dst = is_q ? a.q_out + t * int64_t(a.Hq) * D + int64_t(h) * D
                    : a.kv.k + row + int64_t(h - a.Hq) * D;
  const int half = a.rotary_dim / 2;
  for (int i = lane; i < half; i += 32) {
    const float f = float(slot.pos) * a.inv_freq[i];
    const float cs = cosf(f), sn = sinf(f);
    const float x0 = s[i], x1 = s[i + half];
    dst[i] = x0 * cs - x1 * sn;
    dst[i + half] = x1 * cs + x0 * sn;
  }
  for (int i = a.rotary_dim + lane; i < D; i += 32) dst[i] = s[i];
}

// One block per (layer, K or V): the block's rows, src -> dst.
__global__ void copy_kv_block_kernel(const KvPages kv, int64_t kvd, int32_t src, int32_t dst) {
  const int layer = blockIdx.x >> 1;
  float* base = (blockIdx.x & 1) ? kv.v : kv.k;
  const int64_t n = int64_t(kv.block_tokens) * kvd;
  const float* from = base + (int64_t(layer) * kv.blocks + src) * n;
  float* to = base + (int64_t(layer) * kv.blocks + dst) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) to[i] = from[i];
}

// One block per (token, q head): scores over the context in shared memory, softmax, then each
// thread one output dim as a sequential sum over the context (fixed order: batch-invariant, and
// position order 0..pos whatever blocks hold the keys: the bits do not depend on the layout).
template <class TA>
__global__ void attention_kernel(const float* q, const TokenSlot* slots, const KvPages kv, int layer, int Hq, int Hkv,
                                 int D, TA* ctx) {
  extern __shared__ float asm_[];
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x / Hq;
  const int h = blockIdx.x % Hq, hk = h / (Hq / Hkv);
  const TokenSlot slot = slots[t];
  const int64_t kvd = int64_t(Hkv) * D;
  const int32_t* table = kv.tables + slot.table;
  const float* kc = kv.k + int64_t(hk) * D;
  const float* vc = kv.v + int64_t(hk) * D;
  const int B = kv.block_tokens;
  const int n = slot.pos + 1;
  const float* qh = q + t * int64_t(Hq) * D + int64_t(h) * D;
  float* qs = asm_;      // [D]
  float* p = asm_ + D;   // [n]
  for (int i = threadIdx.x; i < D; i += blockDim.x) qs[i] = qh[i];
  __syncthreads();
  const float scale = 1.0f / sqrtf(float(D));
  // Scores: one warp per key, lanes over the head dims (coalesced rows of K), a fixed-order tree.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float m = -INFINITY;
  for (int j = warp; j < n; j += nw) {
    const float* kj = kc + kv_row(kv, table, layer, j, kvd);
    float d = 0.f;
    for (int i = lane; i < D; i += 32) d += qs[i] * kj[i];
    d = warp_sum(d) * scale;
    if (lane == 0) p[j] = d;
    m = fmaxf(m, d);
  }
  m = block_max(m, scratch);  // (its barriers also publish p[])
  float sum = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    p[j] = expf(p[j] - m);
    sum += p[j];
  }
  sum = block_sum(sum, scratch);
  const float inv = 1.0f / sum;
  __syncthreads();
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float o = 0.f;
    // Block by block, row by row: still j = 0, 1, ..., n - 1 in turn.
    for (int j0 = 0; j0 < n; j0 += B) {
      const float* vb = vc + kv_row(kv, table, layer, j0, kvd) + i;
      const int rows = min(B, n - j0);
      for (int r = 0; r < rows; r++) o += (p[j0 + r] * inv) * vb[int64_t(r) * kvd];
    }
    ctx[t * int64_t(Hq) * D + int64_t(h) * D + i] = from_f32<TA>(o);
  }
}

}  // namespace

void qk_norm_rope_cache(const RopeArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  constexpr int warps = 4;
  const int64_t jobs = a.T * (a.Hq + 2 * a.Hkv);
  rope_kernel<<<ceil_div(jobs, warps), warps * 32, size_t(warps) * a.D * sizeof(float), s>>>(a);
  EPMOE_CUDA_LAUNCHED();
}

void copy_kv_block(const KvPages& kv, int layers, int64_t kvd, int32_t src, int32_t dst, cudaStream_t s) {
  if (layers == 0) return;
  copy_kv_block_kernel<<<unsigned(2 * layers), 256, 0, s>>>(kv, kvd, src, dst);
  EPMOE_CUDA_LAUNCHED();
}

template <class TA>
void attention(const float* q, const TokenSlot* slots, const KvPages& kv, int layer, int64_t T, int Hq, int Hkv, int D,
               int max_ctx, TA* ctx, cudaStream_t s) {
  if (T == 0) return;
  const size_t smem = (size_t(D) + size_t(max_ctx)) * sizeof(float);
  static size_t raised = 48 * 1024;
  if (smem > raised) {
    EPMOE_ASSERT(smem <= 200 * 1024, "gpu attention: context of " + std::to_string(max_ctx) +
                                         " positions exceeds this kernel's shared-memory scores");
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<TA>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    raised = smem;
  }
  attention_kernel<TA><<<unsigned(T * Hq), 128, smem, s>>>(q, slots, kv, layer, Hq, Hkv, D, ctx);
  EPMOE_CUDA_LAUNCHED();
}
template void attention<float>(const float*, const TokenSlot*, const KvPages&, int, int64_t, int, int, int, int, float*,
                               cudaStream_t);
template void attention<bf16>(const float*, const TokenSlot*, const KvPages&, int, int64_t, int, int, int, int, bf16*,
                              cudaStream_t);

}  // namespace epmoe::cuda
