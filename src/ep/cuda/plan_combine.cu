#include "ep/cuda/plan_combine.cuh"

#include <algorithm>

#include "ep/fault.h"
#include "ep/placement.h"

namespace epmoe::cuda {

namespace {

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
  pdl_trigger();
  pdl_wait();  // (PDL, common.cuh) before the first read of an earlier kernel's output
  extern __shared__ int psm[];
  int* cnt = psm;                 // [n_local]
  int* cursor = cnt + a.n_local;  // [n_local]
  int* scratch = cursor + a.n_local;  // [33]
  const int tid = threadIdx.x;
  const int64_t rows = a.rows_dev ? lmin(a.rows, *a.rows_dev) : a.rows;
  const int nt = int(blockDim.x);
  const int64_t chunk = (rows + nt - 1) / nt;
  const int64_t r0 = lmin(rows, tid * chunk), r1 = lmin(rows, r0 + chunk);
  for (int e = tid; e < a.n_local; e += nt) cnt[e] = 0;
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
  // Group offsets: exclusive scan of cnt (n_local may exceed the block: chunks of its size).
  int carry = 0;
  for (int e0 = 0; e0 < a.n_local; e0 += nt) {
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
  if (a.row_base && tid == nt - 1) a.row_base[rows] = total;
}

// Multi-block plan. ws: [B][n_local] counts then bases, [B] served totals then compact bases.
__global__ void __launch_bounds__(kPlanRowsPerBlock) plan_count_kernel(const PlanArgs a, int32_t* ws_cnt,
                                                                         int32_t* ws_tot) {
  pdl_trigger();
  pdl_wait();  // (PDL, common.cuh) before the first read of an earlier kernel's output
  extern __shared__ int psm[];
  int* cnt = psm;
  int* scratch = cnt + a.n_local;
  for (int e = threadIdx.x; e < a.n_local; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int64_t r = int64_t(blockIdx.x) * kPlanRowsPerBlock + threadIdx.x;
  const int64_t rows = a.rows_dev ? lmin(a.rows, *a.rows_dev) : a.rows;  // blocks past it count nothing
  int mine = 0;
  if (r < rows)
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
  pdl_trigger();
  pdl_wait();  // (PDL, common.cuh) before the first read of an earlier kernel's output
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
    if (a.row_base) a.row_base[a.rows_dev ? lmin(a.rows, *a.rows_dev) : a.rows] = run;
  }
  __syncthreads();
  write_tiles(a, scratch);
}

__global__ void __launch_bounds__(kPlanRowsPerBlock) plan_scatter_kernel(const PlanArgs a, const int32_t* ws_cnt,
                                                                           const int32_t* ws_tot) {
  pdl_trigger();
  pdl_wait();  // (PDL, common.cuh) before the first read of an earlier kernel's output
  extern __shared__ int psm[];
  int* cursor = psm;
  int* scratch = cursor + a.n_local;
  for (int e = threadIdx.x; e < a.n_local; e += blockDim.x) cursor[e] = ws_cnt[int64_t(blockIdx.x) * a.n_local + e];
  const int64_t r = int64_t(blockIdx.x) * kPlanRowsPerBlock + threadIdx.x;
  const int64_t rows = a.rows_dev ? lmin(a.rows, *a.rows_dev) : a.rows;
  int mine = 0;
  if (r < rows)
    for (int k = 0; k < a.K; k++) mine += local_expert(a, r, k) >= 0;
  int tot = 0;
  int idx = ws_tot[blockIdx.x] + block_exclusive_scan(mine, scratch, &tot);  // syncs: cursors are ready
  if (r >= rows) return;
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
                                      int K, float scale, float* y, const FlagWait fw) {
  pdl_trigger();
  pdl_wait();  // (PDL, common.cuh) before the first read of an earlier kernel's output
  wait_flags(fw);
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
      for (int q = 0; q < 8; q++) acc[q] = slot_sum_step(acc[q], wk, __bfloat162float(b[q]));
    }
    if (scale != 1.0f)
#pragma unroll
      for (int q = 0; q < 8; q++) acc[q] *= scale;
    float4* o = reinterpret_cast<float4*>(y + t * H + h);
    o[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    o[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  }
}

template <class TS>
__global__ void combine_kernel(const TS* rows, const int32_t* slot_pos, const float* w, int64_t T, int H, int K,
                               float scale, float* y, const FlagWait fw) {
  pdl_trigger();
  pdl_wait();  // (PDL, common.cuh) before the first read of an earlier kernel's output
  wait_flags(fw);
  const int64_t n = T * H;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / H, h = i - t * H;
    float acc = 0.f;
    for (int k = 0; k < K; k++) {
      const int64_t r = slot_pos ? int64_t(slot_pos[t * K + k]) : t * K + k;
      acc = slot_sum_step(acc, w[t * K + k], to_f32(rows[r * H + h]));
    }
    if (scale != 1.0f) acc *= scale;
    y[i] = acc;
  }
}

constexpr int kSkipReduce = int(Fault::SkipReduce), kReplicaPerRank = int(Fault::ReplicaPerRank),
              kWrongCombineIds = int(Fault::WrongCombineIds);

template <class TS>
__global__ void combine_faulty_kernel(const TS* rows, const int32_t* slot_pos, const float* w, int64_t T, int H, int K,
                                      const FaultCombine f, float* y) {
  const int64_t n = T * H;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / H, h = i - t * H;
    float acc = 0.f;
    for (int k = 0; k < K; k++) {
      const int p = f.phys[t * K + k];
      const bool remote = owner_of(f.owner, p) != f.me;
      int64_t src = t;
      if (f.kind == kSkipReduce && remote) continue;
      if (f.kind == kWrongCombineIds) {
        // ep/fault.cc: a remote row of token t lands on token t + 1 (mod T); t's own remote row is
        // gone. Where a local row and a moved one meet, the later write of the CPU's token loop
        // stays: the local row, except at token 0, whose moved row comes from the last token.
        const int64_t prev = (t + T - 1) % T;
        const bool moved_in = owner_of(f.owner, f.phys[prev * K + k]) != f.me;
        if (t > 0 ? remote && moved_in : moved_in) src = prev;
        else if (remote) continue;
      }
      float wk = w[t * K + k];
      if (f.kind == kReplicaPerRank) wk *= float(f.replicas[p]);
      const int64_t r = slot_pos ? int64_t(slot_pos[src * K + k]) : src * K + k;
      acc += wk * to_f32(rows[r * H + h]);
    }
    y[i] = acc * f.scale;
  }
}

template <class TS>
__global__ void reduce_partials_kernel(const unsigned char* records, int64_t rec_bytes, int64_t phys_off, int64_t w_off,
                                       int64_t n, const int32_t* n_dev, const int32_t* row_base, const TS* out, int H,
                                       int K, float* partial) {
  const int64_t count = n_dev ? lmin(n, *n_dev) : n;
  for (int64_t i = blockIdx.x; i < count; i += gridDim.x) {
    const unsigned char* rec = records + i * rec_bytes;
    const int32_t* phys = reinterpret_cast<const int32_t*>(rec + phys_off);
    const float* wt = reinterpret_cast<const float*>(rec + w_off);
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
      float acc = 0.f;
      int64_t j = row_base[i];
      for (int k = 0; k < K; k++)
        if (phys[k] >= 0) acc += wt[k] * to_f32(out[j++ * H + h]);
      partial[i * H + h] = acc;
    }
  }
}

__global__ void combine_partials_kernel(const float* partials, const int32_t* pos, int64_t T, int R, int H,
                                        FaultCombine f, bool faulty, float* y) {
  const int64_t n = T * H;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / H, h = i - t * H;
    float acc = 0.f;
    for (int d = 0; d < R; d++) {
      int64_t src = t;
      if (faulty && d != f.me) {
        if (f.kind == kSkipReduce) continue;
        if (f.kind == kWrongCombineIds) src = (t + T - 1) % T;  // ep/fault.cc fault_partial_token
      }
      const int32_t p = pos[src * R + d];
      if (p >= 0) acc += partials[int64_t(p) * H + h];
    }
    y[i] = faulty ? acc * f.scale : acc;
  }
}

}  // namespace

OwnerTable owner_table(const Placement& p) {
  EPMOE_ASSERT(p.ranks <= kMaxOwnerRanks, "gpu backends: at most 16 ranks");
  OwnerTable o;
  o.R = p.ranks;
  for (int i = 0; i <= p.ranks; i++) o.begin[i] = p.rank_begin[size_t(i)];
  return o;
}

FaultCombine make_fault_combine(Fault f, const Placement& p, int me, DeviceArray<int32_t>& replicas) {
  FaultCombine fc;
  if (f == Fault::None) return fc;
  std::vector<int32_t> rep(size_t(p.num_physical()));
  for (int q = 0; q < p.num_physical(); q++) rep[size_t(q)] = int32_t(p.replicas[size_t(p.logical_of[size_t(q)])].size());
  replicas.upload(rep);
  fc.kind = int(f);
  fc.me = me;
  fc.owner = owner_table(p);
  fc.replicas = replicas.data();
  fc.scale = fault_output_scale(f, p);
  return fc;
}

template <class TS>
void combine_slots_faulty(const TS* rows, const int32_t* slot_pos, const float* w, int64_t T, int H, int K,
                          const FaultCombine& f, float* y, cudaStream_t s) {
  if (T == 0) return;
  combine_faulty_kernel<TS><<<grid_for(T * H), 256, 0, s>>>(rows, slot_pos, w, T, H, K, f, y);
  EPMOE_CUDA_LAUNCHED();
}
template void combine_slots_faulty<float>(const float*, const int32_t*, const float*, int64_t, int, int,
                                          const FaultCombine&, float*, cudaStream_t);
template void combine_slots_faulty<bf16>(const bf16*, const int32_t*, const float*, int64_t, int, int,
                                         const FaultCombine&, float*, cudaStream_t);

template <class TS>
void reduce_partials(const unsigned char* records, int64_t rec_bytes, int64_t phys_off, int64_t w_off, int64_t n,
                     const int32_t* n_dev, const int32_t* row_base, const TS* out, int H, int K, float* partial,
                     cudaStream_t s) {
  if (n == 0) return;
  reduce_partials_kernel<TS><<<unsigned(std::min<int64_t>(n, 4096)), 256, 0, s>>>(records, rec_bytes, phys_off, w_off, n,
                                                                                   n_dev, row_base, out, H, K, partial);
  EPMOE_CUDA_LAUNCHED();
}
template void reduce_partials<float>(const unsigned char*, int64_t, int64_t, int64_t, int64_t, const int32_t*,
                                     const int32_t*, const float*, int, int, float*, cudaStream_t);
template void reduce_partials<bf16>(const unsigned char*, int64_t, int64_t, int64_t, int64_t, const int32_t*,
                                    const int32_t*, const bf16*, int, int, float*, cudaStream_t);

void combine_partials(const float* partials, const int32_t* pos, int64_t T, int R, int H, const FaultCombine* f,
                      float* y, cudaStream_t s) {
  if (T == 0) return;
  combine_partials_kernel<<<grid_for(T * H), 256, 0, s>>>(partials, pos, T, R, H, f ? *f : FaultCombine{}, f != nullptr,
                                                          y);
  EPMOE_CUDA_LAUNCHED();
}

void plan(const PlanArgs& a, cudaStream_t s) {
  EPMOE_ASSERT(a.rows * a.K < (int64_t(1) << 31), "gpu plan: too many jobs");
  EPMOE_ASSERT(!a.tiles || a.tile_m > 0, "gpu plan: tiles need a tile height");
  const size_t smem = (2 * size_t(a.n_local) + 33) * sizeof(int);
  EPMOE_ASSERT(smem <= 48 * 1024, "gpu plan: too many local experts");
  if (plan_in_one_block(a.rows, a.K, a.rows_dev != nullptr)) {
    // A thread per row (whole warps): a decode step's few rows get a small block whose barriers
    // are cheap. A device row count is known only to the kernel: the full block.
    const int threads =
        a.rows_dev ? kPlanThreads : int(std::clamp<int64_t>((a.rows + 31) / 32 * 32, 128, kPlanThreads));
    // (A row count on the device takes the full block: only the kernel knows how many rows come.)
    launch_pdl(plan_kernel, dim3(1), dim3(threads), smem, s, a);
    return;
  }
  const int nb = ceil_div(a.rows, kPlanRowsPerBlock);
  // The caller's workspace (a plan captured into a graph must own what it points to), else one
  // shared by the process; grow-only either way.
  static DeviceArray<int32_t> shared_ws;
  DeviceArray<int32_t>& ws = a.workspace ? *a.workspace : shared_ws;
  ws.reserve(size_t(nb) * (size_t(a.n_local) + 1));
  int32_t* ws_cnt = ws.data();
  int32_t* ws_tot = ws.data() + size_t(nb) * size_t(a.n_local);
  launch_pdl(plan_count_kernel, dim3(nb), dim3(kPlanRowsPerBlock), (size_t(a.n_local) + 33) * sizeof(int), s, a, ws_cnt,
             ws_tot);
  launch_pdl(plan_scan_kernel, dim3(1), dim3(kPlanThreads), 0, s, a, nb, ws_cnt, ws_tot);
  launch_pdl(plan_scatter_kernel, dim3(nb), dim3(kPlanRowsPerBlock), (size_t(a.n_local) + 33) * sizeof(int), s, a,
             static_cast<const int32_t*>(ws_cnt), static_cast<const int32_t*>(ws_tot));
}

template <class TS>
void combine_slots(const TS* rows, const int32_t* slot_pos, const float* w, int64_t T, int H, int K, float scale,
                   float* y, cudaStream_t s, const FlagWait* wait) {
  if (T == 0) return;
  const FlagWait fw = wait ? *wait : FlagWait{};
  if constexpr (std::is_same_v<TS, bf16>) {
    if (H % 8 == 0) {
      launch_pdl(combine_bf16x8_kernel, dim3(grid_for(T * H / 8)), dim3(256), 0, s, rows, slot_pos, w, T, H, K, scale,
                 y, fw);
      return;
    }
  }
  launch_pdl(combine_kernel<TS>, dim3(grid_for(T * H)), dim3(256), 0, s, rows, slot_pos, w, T, H, K, scale, y, fw);
}
template void combine_slots<float>(const float*, const int32_t*, const float*, int64_t, int, int, float, float*,
                                   cudaStream_t, const FlagWait*);
template void combine_slots<bf16>(const bf16*, const int32_t*, const float*, int64_t, int, int, float, float*,
                                  cudaStream_t, const FlagWait*);

}  // namespace epmoe::cuda
