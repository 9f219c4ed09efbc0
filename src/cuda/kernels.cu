#include "cuda/kernels.cuh"

#include <algorithm>

namespace epmoe::cuda {

[[noreturn]] void cuda_fail(const char* expr, cudaError_t e, const char* file, int line) {
  throw Error(std::string("CUDA error at ") + file + ":" + std::to_string(line) + ": " + expr + ": " +
              cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

int sm_count() {
  static int n = [] {
    int dev = 0, v = 0;
    EPMOE_CUDA_CHECK(cudaGetDevice(&dev));
    EPMOE_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Routing: one warp per token. Scores live in shared memory (3 E floats per warp).

__device__ inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Warp argmax with ties to the lower index; idx < 0 means "no candidate" and always loses.
__device__ inline void warp_argmax(float& v, int& idx) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    const bool take = oi >= 0 && (idx < 0 || ov > v || (ov == v && oi < idx));
    if (take) v = ov, idx = oi;
  }
}

// topk_desc of moe/routing.cc over v[0..n), skipping the ids already in sel[0..j).
__device__ inline void warp_topk(const float* v, int n, int k, int* sel) {
  const int lane = threadIdx.x & 31;
  for (int j = 0; j < k; j++) {
    float bv = -INFINITY;
    int bi = -1;
    for (int i = lane; i < n; i += 32) {
      bool taken = false;
      for (int q = 0; q < j; q++) taken |= sel[q] == i;
      if (taken) continue;
      if (bi < 0 || v[i] > bv) bv = v[i], bi = i;
    }
    warp_argmax(bv, bi);
    if (lane == 0) sel[j] = bi;
    __syncwarp();
  }
}

constexpr int kMaxRouterParts = 16;  // router_chunks() never returns more

__global__ void route_kernel(const RouteArgs a) {
  extern __shared__ float rsm[];
  const RoutingConfig& c = a.cfg;
  const int E = c.num_experts, K = c.top_k;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (t >= a.T) return;
  float* sc = rsm + size_t(warp) * (3 * E + 32);  // score (softmax p or sigmoid)
  float* ch = sc + E;                              // choice (biased / masked)
  float* gs = ch + E;                              // group scores
  int* sel = reinterpret_cast<int*>(gs + E);       // [K <= 32]
  const uint64_t gid = a.identity ? 0 : a.gids[t];  // loaded early: its latency overlaps the rest
  // The logits of this token (the split-K partials summed in order, as router_sum does).
  // All partial loads are issued before the first add (a loop of dependent load-add pairs costs
  // one memory latency per partial: 20 us at one token).
  for (int e = lane; e < E; e += 32) {
    float vals[kMaxRouterParts];
#pragma unroll
    for (int p = 0; p < kMaxRouterParts; p++) vals[p] = p < a.parts ? a.logits[p * a.part_stride + t * E + e] : 0.f;
    float v = 0.f;
#pragma unroll
    for (int p = 0; p < kMaxRouterParts; p++)
      if (p < a.parts) v += vals[p];
    sc[e] = v;
  }
  __syncwarp();

  const bool sigmoid = c.kind == RoutingKind::SigmoidGroupLimited;
  if (sigmoid) {
    for (int e = lane; e < E; e += 32) {
      const float s = 1.0f / (1.0f + expf(-sc[e]));
      sc[e] = s;
      ch[e] = s + (a.bias ? a.bias[e] : 0.0f);
    }
  } else {
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, sc[e]);
    m = warp_max(m);
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) {
      const float v = expf(sc[e] - m);
      sc[e] = v;
      sum += v;
    }
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    __syncwarp();
    for (int e = lane; e < E; e += 32) {
      sc[e] *= inv;
      ch[e] = sc[e];
    }
  }
  __syncwarp();

  const bool grouped = sigmoid || (c.kind == RoutingKind::SoftmaxGroupLimited && c.group_limited);
  const int G = c.n_group;
  if (grouped && c.topk_group < G) {
    const int per = E / G;
    for (int g = lane; g < G; g += 32) {
      const float* s = ch + g * per;
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int i = 0; i < per; i++) {
        const float v = s[i];
        if (v > b1) b2 = b1, b1 = v;
        else if (v > b2) b2 = v;
      }
      gs[g] = sigmoid ? b1 + b2 : b1;  // DeepSeek-V3: sum of the best two; V2: max
    }
    __syncwarp();
    warp_topk(gs, G, c.topk_group, sel);
    // Mask the experts of dropped groups to -inf (never 0: see moe/routing.h).
    for (int e = lane; e < E; e += 32) {
      const int g = e / per;
      bool kept = false;
      for (int q = 0; q < c.topk_group; q++) kept |= sel[q] == g;
      if (!kept) ch[e] = -INFINITY;
    }
    __syncwarp();
  }
  warp_topk(ch, E, K, sel);

  float* wsm = gs;  // the group scores are no longer needed: the K weights go here
  if (lane == 0) {
    float* w = wsm;
    float sum = 0.f;
    for (int k = 0; k < K; k++) {
      w[k] = sc[sel[k]];
      sum += w[k];
    }
    switch (c.kind) {
      case RoutingKind::SoftmaxTopK:
        if (c.norm_topk_prob)
          for (int k = 0; k < K; k++) w[k] /= sum;
        break;
      case RoutingKind::SigmoidGroupLimited:
        if (c.norm_topk_prob)
          for (int k = 0; k < K; k++) w[k] /= (sum + 1e-20f);
        for (int k = 0; k < K; k++) w[k] *= c.routed_scaling_factor;
        break;
      case RoutingKind::SoftmaxGroupLimited:
        if (c.norm_topk_prob && K > 1)
          for (int k = 0; k < K; k++) w[k] /= (sum + 1e-20f);
        for (int k = 0; k < K; k++) w[k] *= c.routed_scaling_factor;
        break;
    }
  }
  __syncwarp();
  // One lane per slot: the replica lookups of the K slots run in parallel.
  if (lane < K) {
    const int k = lane, l = sel[k];
    int phys = l;
    if (!a.identity) {
      const int r0 = a.rep_off[l], nr = a.rep_off[l + 1] - r0;
      phys = nr == 1 ? a.rep_list[r0] : a.rep_list[r0 + int(splitmix64(gid * 64 + uint64_t(k)) % uint64_t(nr))];
    }
    if (a.logical) a.logical[t * K + k] = l;
    a.physical[t * K + k] = phys;
    a.weights[t * K + k] = wsm[k];
  }
}

// ---------------------------------------------------------------------------------------------
// Plan. Positions inside an expert's group come from shared-memory atomics: their order varies run
// to run, but a row's result does not depend on its position (batch-invariant GEMM) and its output
// row is fixed by c_rows, so the bits do not vary. Compact indices follow (row, slot) order.
//
// Small inputs: one block of 1024 threads, each a contiguous chunk of rows. Large ones: three
// launches over blocks of 256 rows (count per block, scan, scatter), so that the work is spread
// over the chip instead of one multiprocessor.

constexpr int kPlanThreads = 1024;
constexpr int kPlanRowsPerBlock = 256;

__device__ inline int local_expert(const PlanArgs& a, int64_t r, int k) {
  const int e = a.phys[r * a.phys_stride + k] - a.p0;
  return e >= 0 && e < a.n_local ? e : -1;
}

// Tiles of tile_m rows per expert, from the group offsets (one block; offsets already written).
__device__ void write_tiles(const PlanArgs& a, int* scratch) {
  if (!a.tiles) return;
  int carry = 0;
  for (int e0 = 0; e0 < a.n_local; e0 += blockDim.x) {
    const int e = e0 + threadIdx.x;
    const int rows = e < a.n_local ? a.offsets[e + 1] - a.offsets[e] : 0;
    const int nt = (rows + a.tile_m - 1) / a.tile_m;
    int tot = 0;
    const int first = carry + block_exclusive_scan(nt, scratch, &tot);
    for (int i = 0; i < nt; i++) {
      a.tiles[2 * (first + i)] = e;
      a.tiles[2 * (first + i) + 1] = i * a.tile_m;
    }
    carry += tot;
    __syncthreads();
  }
  if (threadIdx.x == 0) *a.num_tiles = carry;
}

__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const PlanArgs a) {
  extern __shared__ int psm[];
  int* cnt = psm;                 // [n_local]
  int* cursor = cnt + a.n_local;  // [n_local]
  int* scratch = cursor + a.n_local;  // [33]
  const int tid = threadIdx.x;
  const int64_t rows = a.rows_dev ? lmin(a.rows, *a.rows_dev) : a.rows;
  const int64_t chunk = (rows + kPlanThreads - 1) / kPlanThreads;
  const int64_t r0 = lmin(rows, tid * chunk), r1 = lmin(rows, r0 + chunk);
  for (int e = tid; e < a.n_local; e += kPlanThreads) cnt[e] = 0;
  __syncthreads();
  int mine = 0;
  for (int64_t r = r0; r < r1; r++)
    for (int k = 0; k < a.K; k++) {
      const int e = local_expert(a, r, k);
      if (e >= 0) {
        atomicAdd(&cnt[e], 1);
        mine++;
      }
    }
  int total = 0;
  int base = block_exclusive_scan(mine, scratch, &total);
  __syncthreads();
  // Group offsets: exclusive scan of cnt (n_local may exceed the block: chunks of 1024).
  int carry = 0;
  for (int e0 = 0; e0 < a.n_local; e0 += kPlanThreads) {
    const int e = e0 + tid;
    const int v = e < a.n_local ? cnt[e] : 0;
    int tot = 0;
    const int ex = block_exclusive_scan(v, scratch, &tot);
    if (e < a.n_local) {
      cursor[e] = carry + ex;
      a.offsets[e] = carry + ex;
    }
    carry += tot;
    __syncthreads();
  }
  if (tid == 0) a.offsets[a.n_local] = carry;
  __syncthreads();
  write_tiles(a, scratch);
  for (int64_t r = r0; r < r1; r++) {
    if (a.row_base) a.row_base[r] = base;
    for (int k = 0; k < a.K; k++) {
      const int e = local_expert(a, r, k);
      if (e >= 0) {
        const int pos = atomicAdd(&cursor[e], 1);
        a.a_rows[pos] = int32_t(r);
        a.c_rows[pos] = a.compact ? base : a.one_per_row ? int32_t(r) : int32_t(r * a.K + k);
        base++;
      }
    }
  }
  if (a.row_base && tid == kPlanThreads - 1) a.row_base[rows] = total;
}

// Multi-block plan. ws: [B][n_local] counts then bases, [B] served totals then compact bases.
__global__ void __launch_bounds__(kPlanRowsPerBlock) plan_count_kernel(const PlanArgs a, int32_t* ws_cnt,
                                                                         int32_t* ws_tot) {
  extern __shared__ int psm[];
  int* cnt = psm;
  int* scratch = cnt + a.n_local;
  for (int e = threadIdx.x; e < a.n_local; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int64_t r = int64_t(blockIdx.x) * kPlanRowsPerBlock + threadIdx.x;
  int mine = 0;
  if (r < a.rows)
    for (int k = 0; k < a.K; k++) {
      const int e = local_expert(a, r, k);
      if (e >= 0) atomicAdd(&cnt[e], 1), mine++;
    }
  int tot = 0;
  block_exclusive_scan(mine, scratch, &tot);
  __syncthreads();
  for (int e = threadIdx.x; e < a.n_local; e += blockDim.x) ws_cnt[int64_t(blockIdx.x) * a.n_local + e] = cnt[e];
  if (threadIdx.x == 0) ws_tot[blockIdx.x] = tot;
}

__global__ void __launch_bounds__(kPlanThreads) plan_scan_kernel(const PlanArgs a, int nb, int32_t* ws_cnt,
                                                                  int32_t* ws_tot) {
  __shared__ int scratch[33];
  // Per expert: bases of the blocks in block order, then the group offsets over experts.
  int carry = 0;
  for (int e0 = 0; e0 < a.n_local; e0 += kPlanThreads) {
    const int e = e0 + threadIdx.x;
    int run = 0;
    if (e < a.n_local)
      for (int b = 0; b < nb; b++) {
        const int c = ws_cnt[int64_t(b) * a.n_local + e];
        ws_cnt[int64_t(b) * a.n_local + e] = run;
        run += c;
      }
    int tot = 0;
    const int ex = carry + block_exclusive_scan(run, scratch, &tot);
    if (e < a.n_local) {
      a.offsets[e] = ex;
      for (int b = 0; b < nb; b++) ws_cnt[int64_t(b) * a.n_local + e] += ex;
    }
    carry += tot;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    a.offsets[a.n_local] = carry;
    int run = 0;  // compact bases of the blocks
    for (int b = 0; b < nb; b++) {
      const int c = ws_tot[b];
      ws_tot[b] = run;
      run += c;
    }
    if (a.row_base) a.row_base[a.rows] = run;
  }
  __syncthreads();
  write_tiles(a, scratch);
}

__global__ void __launch_bounds__(kPlanRowsPerBlock) plan_scatter_kernel(const PlanArgs a, const int32_t* ws_cnt,
                                                                           const int32_t* ws_tot) {
  extern __shared__ int psm[];
  int* cursor = psm;
  int* scratch = cursor + a.n_local;
  for (int e = threadIdx.x; e < a.n_local; e += blockDim.x) cursor[e] = ws_cnt[int64_t(blockIdx.x) * a.n_local + e];
  const int64_t r = int64_t(blockIdx.x) * kPlanRowsPerBlock + threadIdx.x;
  int mine = 0;
  if (r < a.rows)
    for (int k = 0; k < a.K; k++) mine += local_expert(a, r, k) >= 0;
  int tot = 0;
  int idx = ws_tot[blockIdx.x] + block_exclusive_scan(mine, scratch, &tot);  // syncs: cursors are ready
  if (r >= a.rows) return;
  if (a.row_base) a.row_base[r] = idx;
  for (int k = 0; k < a.K; k++) {
    const int e = local_expert(a, r, k);
    if (e < 0) continue;
    const int pos = atomicAdd(&cursor[e], 1);
    a.a_rows[pos] = int32_t(r);
    a.c_rows[pos] = a.compact ? idx : a.one_per_row ? int32_t(r) : int32_t(r * a.K + k);
    idx++;
  }
}

// ---------------------------------------------------------------------------------------------

// bf16 rows, H % 8 == 0: eight columns per thread, 16-byte loads (same sums, same order).
__global__ void combine_bf16x8_kernel(const bf16* rows, const int32_t* slot_pos, const float* w, int64_t T, int H,
                                      int K, float scale, float* y) {
  const int H8 = H / 8;
  const int64_t n = T * H8;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / H8, h = (i - t * H8) * 8;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < K; k++) {
      const int64_t r = slot_pos ? int64_t(slot_pos[t * K + k]) : t * K + k;
      const float wk = w[t * K + k];
      const uint4 v = *reinterpret_cast<const uint4*>(rows + r * H + h);
      const bf16* b = reinterpret_cast<const bf16*>(&v);
#pragma unroll
      for (int q = 0; q < 8; q++) acc[q] += wk * __bfloat162float(b[q]);
    }
    if (scale != 1.0f)
#pragma unroll
      for (int q = 0; q < 8; q++) acc[q] *= scale;
    float4* o = reinterpret_cast<float4*>(y + t * H + h);
    o[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    o[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  }
}

__global__ void argmax_kernel(const float* logits, int V, int32_t* out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* x = logits + int64_t(blockIdx.x) * V;
  float bv = -INFINITY;
  int bi = -1;
  for (int i = threadIdx.x; i < V; i += blockDim.x)
    if (bi < 0 || x[i] > bv) bv = x[i], bi = i;
  warp_argmax(bv, bi);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    bv = lane < int(blockDim.x >> 5) ? sv[lane] : -INFINITY;
    bi = lane < int(blockDim.x >> 5) ? si[lane] : -1;
    warp_argmax(bv, bi);
    if (lane == 0) out[blockIdx.x] = bi;
  }
}

template <class TS>
__global__ void combine_kernel(const TS* rows, const int32_t* slot_pos, const float* w, int64_t T, int H, int K,
                               float scale, float* y) {
  const int64_t n = T * H;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / H, h = i - t * H;
    float acc = 0.f;
    for (int k = 0; k < K; k++) {
      const int64_t r = slot_pos ? int64_t(slot_pos[t * K + k]) : t * K + k;
      acc += w[t * K + k] * to_f32(rows[r * H + h]);
    }
    if (scale != 1.0f) acc *= scale;
    y[i] = acc;
  }
}

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

template <class TA>
__global__ void rmsnorm_kernel(const float* x, const float* w, float eps, int H, const int32_t* rows, float* of,
                               TA* oa) {
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const float* r = x + (rows ? int64_t(rows[t]) : t) * H;
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) ss += r[i] * r[i];
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(H) + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    const float v = w[i] * (r[i] * inv);
    if (of) of[t * H + i] = v;
    if (oa) oa[t * H + i] = from_f32<TA>(v);
  }
}

template <class TW>
__global__ void embed_kernel(const int32_t* ids, const TW* table, int H, float* out) {
  const int64_t t = blockIdx.x;
  const TW* row = table + int64_t(ids[t]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) out[t * H + i] = to_f32(row[i]);
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

template <class TO>
__global__ void convert_kernel(const float* in, TO* out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<TO>(in[i]);
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
  const int64_t layer_off = int64_t(a.layer) * slot.cap * kvd;
  if (h >= a.Hq + a.Hkv) {  // v: straight into the cache
    float* dst = slot.v + layer_off + int64_t(slot.pos) * kvd + int64_t(h - a.Hq - a.Hkv) * D;
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
                    : slot.k + layer_off + int64_t(slot.pos) * kvd + int64_t(h - a.Hq) * D;
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

// One block per (token, q head): scores over the context in shared memory, softmax, then each
// thread one output dim as a sequential sum over the context (fixed order: batch-invariant).
template <class TA>
__global__ void attention_kernel(const float* q, const TokenSlot* slots, int layer, int Hq, int Hkv, int D, TA* ctx) {
  extern __shared__ float asm_[];
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x / Hq;
  const int h = blockIdx.x % Hq, hk = h / (Hq / Hkv);
  const TokenSlot slot = slots[t];
  const int64_t kvd = int64_t(Hkv) * D;
  const int64_t layer_off = int64_t(layer) * slot.cap * kvd;
  const float* kc = slot.k + layer_off + int64_t(hk) * D;
  const float* vc = slot.v + layer_off + int64_t(hk) * D;
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
    const float* kj = kc + int64_t(j) * kvd;
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
    for (int j = 0; j < n; j++) o += (p[j] * inv) * vc[int64_t(j) * kvd + i];
    ctx[t * int64_t(Hq) * D + int64_t(h) * D + i] = from_f32<TA>(o);
  }
}

template <class T>
__global__ void fill_random_kernel(T* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64(seed * 0x100000001b3ull + uint64_t(i));
    const float u = float(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = from_f32<T>((2.0f * u - 1.0f) * scale);
  }
}

__global__ void router_split_kernel(const float* x, int64_t T, int H, int S, bf16* out) {
  const int64_t n = T * H;
  const int Kc = 3 * H / S;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / H;
    const int h = int(i - t * H);
    const float v = x[i];
    const bf16 hi = __float2bfloat16_rn(v);
    const bf16 lo = __float2bfloat16_rn(v - __bfloat162float(hi));
    const bf16 parts[3] = {hi, hi, lo};
#pragma unroll
    for (int q = 0; q < 3; q++) {
      const int kk = q * H + h, s = kk / Kc, c = kk - s * Kc;
      out[(int64_t(s) * T + t) * Kc + c] = parts[q];
    }
  }
}

__global__ void router_sum_kernel(const float* part, int S, int64_t T, int E, float* out) {
  const int64_t n = T * E;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < S; s++) acc += part[int64_t(s) * n + i];
    out[i] = acc;
  }
}

int grid_for(int64_t n, int threads = 256) {
  return int(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, int64_t(sm_count()) * 16)));
}

}  // namespace

void route(const RouteArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  const int E = a.cfg.num_experts;
  EPMOE_ASSERT(a.cfg.top_k <= 32 && a.cfg.n_group <= E, "gpu routing: top_k <= 32 and n_group <= E");
  EPMOE_ASSERT(a.parts >= 1 && a.parts <= kMaxRouterParts, "gpu routing: 1..16 logit partials");
  constexpr int warps = 4;
  const size_t smem = size_t(warps) * (3 * E + 32) * sizeof(float);
  EPMOE_ASSERT(smem <= 48 * 1024, "gpu routing: too many experts for one warp's shared memory");
  route_kernel<<<ceil_div(a.T, warps), warps * 32, smem, s>>>(a);
  EPMOE_CUDA_LAUNCHED();
}

void plan(const PlanArgs& a, cudaStream_t s) {
  EPMOE_ASSERT(a.rows * a.K < (int64_t(1) << 31), "gpu plan: too many jobs");
  EPMOE_ASSERT(!a.tiles || a.tile_m > 0, "gpu plan: tiles need a tile height");
  const size_t smem = (2 * size_t(a.n_local) + 33) * sizeof(int);
  EPMOE_ASSERT(smem <= 48 * 1024, "gpu plan: too many local experts");
  if (a.rows * a.K <= 8192 || a.rows_dev) {
    plan_kernel<<<1, kPlanThreads, smem, s>>>(a);
    EPMOE_CUDA_LAUNCHED();
    return;
  }
  const int nb = ceil_div(a.rows, kPlanRowsPerBlock);
  static DeviceArray<int32_t> ws;  // grow-only; sized before any graph capture by a warm-up run
  ws.reserve(size_t(nb) * (size_t(a.n_local) + 1));
  int32_t* ws_cnt = ws.data();
  int32_t* ws_tot = ws.data() + size_t(nb) * size_t(a.n_local);
  plan_count_kernel<<<nb, kPlanRowsPerBlock, (size_t(a.n_local) + 33) * sizeof(int), s>>>(a, ws_cnt, ws_tot);
  EPMOE_CUDA_LAUNCHED();
  plan_scan_kernel<<<1, kPlanThreads, 0, s>>>(a, nb, ws_cnt, ws_tot);
  EPMOE_CUDA_LAUNCHED();
  plan_scatter_kernel<<<nb, kPlanRowsPerBlock, (size_t(a.n_local) + 33) * sizeof(int), s>>>(a, ws_cnt, ws_tot);
  EPMOE_CUDA_LAUNCHED();
}

template <class TS>
void combine_slots(const TS* rows, const int32_t* slot_pos, const float* w, int64_t T, int H, int K, float scale,
                   float* y, cudaStream_t s) {
  if (T == 0) return;
  if constexpr (std::is_same_v<TS, bf16>) {
    if (H % 8 == 0) {
      combine_bf16x8_kernel<<<grid_for(T * H / 8), 256, 0, s>>>(rows, slot_pos, w, T, H, K, scale, y);
      EPMOE_CUDA_LAUNCHED();
      return;
    }
  }
  combine_kernel<TS><<<grid_for(T * H), 256, 0, s>>>(rows, slot_pos, w, T, H, K, scale, y);
  EPMOE_CUDA_LAUNCHED();
}
template void combine_slots<float>(const float*, const int32_t*, const float*, int64_t, int, int, float, float*,
                                   cudaStream_t);
template void combine_slots<bf16>(const bf16*, const int32_t*, const float*, int64_t, int, int, float, float*,
                                  cudaStream_t);

void moe_output(const float* routed, const float* shared, const float* gate_logit, int64_t T, int H, float* out,
                bool accumulate, cudaStream_t s) {
  if (T == 0) return;
  moe_output_kernel<<<grid_for(T * H), 256, 0, s>>>(routed, shared, gate_logit, T, H, out, accumulate);
  EPMOE_CUDA_LAUNCHED();
}

template <class TA>
void rmsnorm(const float* x, const float* w, float eps, int64_t T, int H, const int32_t* rows, float* out_f32,
             TA* out_act, cudaStream_t s) {
  if (T == 0) return;
  rmsnorm_kernel<TA><<<unsigned(T), 256, 0, s>>>(x, w, eps, H, rows, out_f32, out_act);
  EPMOE_CUDA_LAUNCHED();
}
template void rmsnorm<float>(const float*, const float*, float, int64_t, int, const int32_t*, float*, float*, cudaStream_t);
template void rmsnorm<bf16>(const float*, const float*, float, int64_t, int, const int32_t*, float*, bf16*, cudaStream_t);

template <class TW>
void embed(const int32_t* ids, const TW* table, int64_t T, int H, float* out, cudaStream_t s) {
  if (T == 0) return;
  embed_kernel<TW><<<unsigned(T), 256, 0, s>>>(ids, table, H, out);
  EPMOE_CUDA_LAUNCHED();
}
template void embed<float>(const int32_t*, const float*, int64_t, int, float*, cudaStream_t);
template void embed<bf16>(const int32_t*, const bf16*, int64_t, int, float*, cudaStream_t);

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), 256, 0, s>>>(x, y, n);
  EPMOE_CUDA_LAUNCHED();
}

template <class TO>
void convert(const float* in, TO* out, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  convert_kernel<TO><<<grid_for(n), 256, 0, s>>>(in, out, n);
  EPMOE_CUDA_LAUNCHED();
}
template void convert<float>(const float*, float*, int64_t, cudaStream_t);
template void convert<bf16>(const float*, bf16*, int64_t, cudaStream_t);

void qk_norm_rope_cache(const RopeArgs& a, cudaStream_t s) {
  if (a.T == 0) return;
  constexpr int warps = 4;
  const int64_t jobs = a.T * (a.Hq + 2 * a.Hkv);
  rope_kernel<<<ceil_div(jobs, warps), warps * 32, size_t(warps) * a.D * sizeof(float), s>>>(a);
  EPMOE_CUDA_LAUNCHED();
}

template <class TA>
void attention(const float* q, const TokenSlot* slots, int layer, int64_t T, int Hq, int Hkv, int D, int max_ctx,
               TA* ctx, cudaStream_t s) {
  if (T == 0) return;
  const size_t smem = (size_t(D) + size_t(max_ctx)) * sizeof(float);
  static size_t raised = 48 * 1024;
  if (smem > raised) {
    EPMOE_ASSERT(smem <= 200 * 1024, "gpu attention: context of " + std::to_string(max_ctx) +
                                         " positions exceeds this kernel's shared-memory scores");
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<TA>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    raised = smem;
  }
  attention_kernel<TA><<<unsigned(T * Hq), 128, smem, s>>>(q, slots, layer, Hq, Hkv, D, ctx);
  EPMOE_CUDA_LAUNCHED();
}
template void attention<float>(const float*, const TokenSlot*, int, int64_t, int, int, int, int, float*, cudaStream_t);
template void attention<bf16>(const float*, const TokenSlot*, int, int64_t, int, int, int, int, bf16*, cudaStream_t);

void argmax_rows(const float* logits, int64_t R, int V, int32_t* out, cudaStream_t s) {
  if (R == 0) return;
  argmax_kernel<<<unsigned(R), 256, 0, s>>>(logits, V, out);
  EPMOE_CUDA_LAUNCHED();
}

int router_chunks(int H) {
  for (int S : {16, 8, 4, 2})
    if ((3 * H) % (8 * S) == 0) return S;
  return 1;
}

void router_split(const float* x, int64_t T, int H, int S, bf16* out, cudaStream_t s) {
  if (T == 0) return;
  router_split_kernel<<<grid_for(T * H), 256, 0, s>>>(x, T, H, S, out);
  EPMOE_CUDA_LAUNCHED();
}

void router_sum(const float* part, int S, int64_t T, int E, float* out, cudaStream_t s) {
  if (T == 0) return;
  router_sum_kernel<<<grid_for(T * E), 256, 0, s>>>(part, S, T, E, out);
  EPMOE_CUDA_LAUNCHED();
}

std::vector<bf16> router_split_weights(const std::vector<float>& w, int E, int H) {
  std::vector<bf16> out(size_t(E) * 3 * size_t(H));
  for (int e = 0; e < E; e++)
    for (int h = 0; h < H; h++) {
      const float v = w[size_t(e) * H + h];
      const bf16 hi = __float2bfloat16_rn(v);
      const bf16 lo = __float2bfloat16_rn(v - __bfloat162float(hi));
      bf16* row = &out[size_t(e) * 3 * H];
      row[h] = hi;
      row[H + h] = lo;
      row[2 * H + h] = hi;
    }
  return out;
}

template <class T>
void fill_random(T* p, int64_t n, uint64_t seed, float scale, cudaStream_t s) {
  if (n == 0) return;
  fill_random_kernel<T><<<grid_for(n), 256, 0, s>>>(p, n, seed, scale);
  EPMOE_CUDA_LAUNCHED();
}
template void fill_random<float>(float*, int64_t, uint64_t, float, cudaStream_t);
template void fill_random<bf16>(bf16*, int64_t, uint64_t, float, cudaStream_t);

}  // namespace epmoe::cuda
