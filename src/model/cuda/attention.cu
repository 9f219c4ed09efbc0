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
  pdl_wait();  // (launched with launch_pdl: nothing of an earlier kernel is touched before this)
  pdl_trigger();
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
    const float cs = cosf(f) * a.attention_factor, sn = sinf(f) * a.attention_factor;  // (* 1: exact)
    const float x0 = s[i], x1 = s[i + half];
    dst[i] = x0 * cs - x1 * sn;
    dst[i + half] = x1 * cs + x0 * sn;
  }
  for (int i = a.rotary_dim + lane; i < D; i += 32) dst[i] = s[i];
}

// One block per (layer, K or V): the block's rows, src -> dst.
__global__ void copy_kv_block_kernel(const KvPages kv, int64_t k_width, int64_t v_width, int32_t src, int32_t dst) {
  const int layer = blockIdx.x >> 1;
  const bool is_v = blockIdx.x & 1;
  float* base = is_v ? kv.v : kv.k;
  const int64_t n = int64_t(kv.block_tokens) * (is_v ? v_width : k_width);
  if (n == 0 || !base) return;
  const float* from = base + (int64_t(layer) * kv.blocks + src) * n;
  float* to = base + (int64_t(layer) * kv.blocks + dst) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) to[i] = from[i];
}

// One block per (token, q head): scores over the context in shared memory, softmax, then each
// thread one output dim as a sequential sum over the context (fixed order: batch-invariant, and
// position order 0..pos whatever blocks hold the keys: the bits do not depend on the layout).
template <class TA>
__global__ void attention_kernel(const AttnArgs a, TA* ctx) {
  extern __shared__ float asm_[];
  __shared__ float scratch[32];
  pdl_wait();  // (launched with launch_pdl: nothing of an earlier kernel is touched before this)
  pdl_trigger();
  const KvPages& kv = a.kv;
  const int Hq = a.Hq, Dk = a.Dk, Dv = a.Dv;
  const int64_t t = blockIdx.x / Hq;
  const int h = blockIdx.x % Hq, hk = h / (Hq / a.Hkv);
  const TokenSlot slot = a.slots[t];
  const int32_t* table = kv.tables + slot.table;
  const float* kc = kv.k + int64_t(hk) * Dk;
  const float* vc = kv.v + int64_t(hk) * Dv;
  const int B = kv.block_tokens;
  const int n = slot.pos + 1;
  const float* qh = a.q + t * a.q_tok + int64_t(h) * a.q_head;
  float* qs = asm_;      // [Dk]
  float* p = asm_ + Dk;  // [n]
  for (int i = threadIdx.x; i < Dk; i += blockDim.x) qs[i] = qh[i];
  __syncthreads();
  const float scale = a.scale;
  // Scores: one warp per key, lanes over the head dims (coalesced rows of K), a fixed-order tree.
  // A warp takes four keys at a time so that their loads (the block table, then the rows) are in
  // flight together; each key's sum is still its own chain in the same order.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  constexpr int KU = 4;
  float m = -INFINITY;
  for (int j0 = warp; j0 < n; j0 += KU * nw) {
    const float* kj[KU];
#pragma unroll
    for (int u = 0; u < KU; u++) {
      const int j = j0 + u * nw;
      kj[u] = kc + kv_row(kv, table, a.layer, j < n ? j : j0, a.k_stride);
    }
    float d[KU] = {};
    for (int i = lane; i < Dk; i += 32)
#pragma unroll
      for (int u = 0; u < KU; u++) d[u] += qs[i] * kj[u][i];
#pragma unroll
    for (int u = 0; u < KU; u++) {
      const int j = j0 + u * nw;
      const float dj = warp_sum(d[u]) * scale;
      if (j < n) {
        if (lane == 0) p[j] = dj;
        m = fmaxf(m, dj);
      }
    }
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
  for (int i = threadIdx.x; i < Dv; i += blockDim.x) {
    float o = 0.f;
    // Block by block, row by row: still j = 0, 1, ..., n - 1 in turn.
    for (int j0 = 0; j0 < n; j0 += B) {
      const float* vb = vc + kv_row(kv, table, a.layer, j0, a.v_stride) + i;
      const int rows = min(B, n - j0);
      int r = 0;
      for (; r + 8 <= rows; r += 8) {  // eight rows' loads in flight, then their terms in order
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = vb[int64_t(r + u) * a.v_stride];
#pragma unroll
        for (int u = 0; u < 8; u++) o += (p[j0 + r + u] * inv) * v[u];
      }
      for (; r < rows; r++) o += (p[j0 + r] * inv) * vb[int64_t(r) * a.v_stride];
    }
    ctx[t * a.o_tok + int64_t(h) * a.o_head + i] = from_f32<TA>(o);
  }
}

// Rope of dr dims at position pos, from in to out (may not alias across lanes: each lane reads
// and writes its own pairs), lanes of one warp; cos/sin in fp32 times the attention factor, as
// kernels/ops.cc Rope::apply.
__device__ inline void rope_lanes(const float* in, float* out, int dr, int pos, const float* inv_freq, float af,
                                  bool interleaved, int lane, int lanes) {
  const int half = dr / 2;
  for (int i = lane; i < half; i += lanes) {
    const float f = float(pos) * inv_freq[i];
    const float c = cosf(f) * af, sn = sinf(f) * af;
    const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    const float x0 = in[i0], x1 = in[i1];
    out[i0] = x0 * c - x1 * sn;
    out[i1] = x1 * c + x0 * sn;
  }
}

// One block per token: the q LoRA norm, the latent norm and the rotated k_rope into the cache.
__global__ void mla_latent_kernel(const MlaLatentArgs a) {
  __shared__ float scratch[32];
  pdl_wait();  // (launched with launch_pdl: nothing of an earlier kernel is touched before this)
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const float* row = a.a + t * a.lda;
  if (a.q_lora > 0) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < a.q_lora; i += blockDim.x) ss += row[i] * row[i];
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / float(a.q_lora) + a.eps);
    for (int i = threadIdx.x; i < a.q_lora; i += blockDim.x) a.qa_out[t * a.q_lora + i] = a.q_a_norm[i] * (row[i] * inv);
  }
  const TokenSlot slot = a.slots[t];
  const int64_t W = int64_t(a.C) + a.dr;
  float* dst = a.kv.k + kv_row(a.kv, a.kv.tables + slot.table, a.layer, slot.pos, W);
  const float* lat = row + a.q_width;
  float ss = 0.f;
  for (int i = threadIdx.x; i < a.C; i += blockDim.x) ss += lat[i] * lat[i];
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(a.C) + a.eps);
  for (int i = threadIdx.x; i < a.C; i += blockDim.x) dst[i] = a.kv_a_norm[i] * (lat[i] * inv);
  if (threadIdx.x < 32)
    rope_lanes(lat + a.C, dst + a.C, a.dr, slot.pos, a.inv_freq, a.attention_factor, a.interleaved, threadIdx.x, 32);
}

// One warp per (token, head).
__global__ void mla_query_kernel(const MlaQueryArgs a) {
  pdl_wait();  // (launched with launch_pdl: nothing of an earlier kernel is touched before this)
  pdl_trigger();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t job = int64_t(blockIdx.x) * nw + warp;
  if (job >= a.T * a.Hq) return;
  const int64_t t = job / a.Hq;
  const int h = int(job % a.Hq);
  const float* qh = a.q + t * a.ldq + int64_t(h) * (a.dn + a.dr);
  float* qn = a.q_nope + (int64_t(h) * a.T + t) * a.dn;
  for (int i = lane; i < a.dn; i += 32) qn[i] = qh[i];
  float* qr = a.q_cat + (t * a.Hq + h) * (int64_t(a.C) + a.dr) + a.C;
  rope_lanes(qh + a.dn, qr, a.dr, a.slots[t].pos, a.inv_freq, a.attention_factor, a.interleaved, lane, 32);
}

__global__ void head_major_rows_kernel(int64_t T, int Hq, int32_t* out) {
  pdl_wait();  // (launched with launch_pdl: nothing of an earlier kernel is touched before this)
  pdl_trigger();
  const int64_t n = T * Hq;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i / T, t = i - h * T;
    out[i] = int32_t(t * Hq + h);
  }
}

}  // namespace

void qk_norm_rope_cache(const RopeArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  constexpr int warps = 4;
  const int64_t jobs = a.T * (a.Hq + 2 * a.Hkv);
  launch_pdl(rope_kernel, dim3(unsigned(ceil_div(jobs, warps))), dim3(warps * 32), size_t(warps) * a.D * sizeof(float), s, a);
  EPMOE_CUDA_LAUNCHED();
}

void copy_kv_block(const KvPages& kv, int layers, int64_t k_width, int64_t v_width, int32_t src, int32_t dst,
                   cudaStream_t s) {
  if (layers == 0) return;
  copy_kv_block_kernel<<<unsigned(2 * layers), 256, 0, s>>>(kv, k_width, v_width, src, dst);
  EPMOE_CUDA_LAUNCHED();
}

// The dynamic shared memory of attention_kernel: the query and the scores of max_ctx positions.
static size_t attention_smem(int Dk, int max_ctx) { return (size_t(Dk) + size_t(max_ctx)) * sizeof(float); }

void attention_prepare(int Dk, int max_ctx) {
  static size_t raised = 48 * 1024;  // the limit set on both instantiations
  const size_t smem = attention_smem(Dk, max_ctx);
  if (smem <= raised) return;
  EPMOE_ASSERT(smem <= 200 * 1024, "gpu attention: context of " + std::to_string(max_ctx) +
                                       " positions exceeds this kernel's shared-memory scores");
  EPMOE_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  EPMOE_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  raised = smem;
}

template <class TA>
void attention(const AttnArgs& a, TA* ctx, cudaStream_t s) {
  if (a.T == 0) return;
  EPMOE_ASSERT(a.Hkv >= 1 && a.Hq % a.Hkv == 0, "gpu attention: q heads a multiple of kv heads");
  attention_prepare(a.Dk, a.max_ctx);
  launch_pdl(attention_kernel<TA>, dim3(unsigned(a.T * a.Hq)), dim3(128), attention_smem(a.Dk, a.max_ctx), s, a, ctx);
  EPMOE_CUDA_LAUNCHED();
}
template void attention<float>(const AttnArgs&, float*, cudaStream_t);
template void attention<bf16>(const AttnArgs&, bf16*, cudaStream_t);

void mla_latent_cache(const MlaLatentArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  EPMOE_ASSERT(a.dr % 2 == 0, "mla: qk_rope_head_dim " + std::to_string(a.dr) + " is not even");
  launch_pdl(mla_latent_kernel, dim3(unsigned(a.T)), dim3(128), 0, s, a);
  EPMOE_CUDA_LAUNCHED();
}

void mla_queries(const MlaQueryArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  constexpr int warps = 4;
  launch_pdl(mla_query_kernel, dim3(unsigned(ceil_div(a.T * a.Hq, warps))), dim3(warps * 32), 0, s, a);
  EPMOE_CUDA_LAUNCHED();
}

void head_major_rows(int64_t T, int Hq, int32_t* out, cudaStream_t s) {
  if (T == 0) return;
  launch_pdl(head_major_rows_kernel, dim3(unsigned(grid_for(T * Hq))), dim3(256), 0, s, T, Hq, out);
  EPMOE_CUDA_LAUNCHED();
}

}  // namespace epmoe::cuda
