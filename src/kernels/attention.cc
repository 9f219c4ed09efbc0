#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_rows.h"
#include "kernels/matmul_micro.h"
#include "kernels/ops.h"
#include "kernels/vec.h"
#include "util/error.h"
#include "util/threads.h"

namespace epmoe {

namespace {

// Rows per tile: a kv head's query group times enough consecutive tokens to make ~32 rows, so a K
// or V row fetched from the cache serves 32 dot products / context updates (decode: the group).
constexpr int kTileRows = 32;

struct Job {
  int32_t seq, kv_head;
  int64_t i0, m;  // tokens i0 .. i0 + m - 1 of the sequence
  int64_t work;   // ~ rows x keys, for ordering
};

}  // namespace

void causal_attention(const AttentionDims& d, const std::vector<AttentionSeq>& seqs, const float* q, float* ctx) {
  EPMOE_ASSERT(d.heads > 0 && d.kv_heads > 0 && d.heads % d.kv_heads == 0 && d.head_dim > 0,
               "attention: " + std::to_string(d.heads) + " heads over " + std::to_string(d.kv_heads) + " kv heads");
  const int group = d.heads / d.kv_heads, D = d.head_dim;
  const int64_t qd = int64_t(d.heads) * D;
  const int64_t tokens_per_tile = std::max(1, kTileRows / group);
  std::vector<Job> jobs;
  for (size_t s = 0; s < seqs.size(); s++)
    for (int64_t i0 = 0; i0 < seqs[s].n; i0 += tokens_per_tile)
      for (int h = 0; h < d.kv_heads; h++) {
        const int64_t m = std::min(tokens_per_tile, seqs[s].n - i0);
        jobs.push_back({int32_t(s), h, i0, m, m * group * (seqs[s].base + i0 + m)});
      }
  // Longest contexts first: the pool hands out tasks in order, so the short ones fill the gaps.
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.work > b.work; });

  // The scores: the fp32 matmul micro-kernel (fp32 keys take it in either compute mode).
  const Micro dotk = select_micro(DType::F32, ComputeMode::F32);
  // The vector row kernels go with the scores' path: AVX-512, or its AVX2 twin (the same bits).
  const std::string path = dotk.name;
  const bool vec = path == "avx512" || path == "avx2";
  auto softmax_row = path == "avx512" ? &softmax_row_avx512 : &softmax_row_avx2;
  auto pv_rows = path == "avx512" ? &pv_rows_avx512 : &pv_rows_avx2;
  parallel_for(int64_t(jobs.size()), 1, [&](int64_t jb, int64_t je) {
    thread_local std::vector<float> scores;
    std::vector<const float*> qrow, prow;
    std::vector<float*> orow;
    std::vector<int64_t> len;
    for (int64_t ji = jb; ji < je; ji++) {
      const Job& job = jobs[size_t(ji)];
      const AttentionSeq& sq = seqs[size_t(job.seq)];
      const int R = int(job.m) * group;
      const int64_t maxlen = sq.base + job.i0 + job.m, ld = (maxlen + 15) / 16 * 16;
      scores.resize(size_t(R) * size_t(ld));
      qrow.resize(size_t(R));
      prow.resize(size_t(R));
      orow.resize(size_t(R));
      len.resize(size_t(R));
      for (int r = 0; r < R; r++) {  // row r: token i0 + r / group, head kv_head * group + r % group
        const int64_t t = sq.t0 + job.i0 + r / group;
        const int64_t col = int64_t(job.kv_head * group + r % group) * D;
        qrow[size_t(r)] = q + t * qd + col;
        orow[size_t(r)] = ctx + t * qd + col;
        prow[size_t(r)] = &scores[size_t(r) * size_t(ld)];
        len[size_t(r)] = sq.base + job.i0 + r / group + 1;
      }
      const int64_t koff = int64_t(job.kv_head) * D;

      // Scores of every row against keys [0, maxlen), 4 x 4 micro-tiles; a row's keys beyond its
      // own length are computed and never read.
      const void* x[kMaxMR];
      const void* w[kMaxNR];
      float out[kMaxMR * kMaxNR];
      for (int64_t j0 = 0; j0 < maxlen; j0 += kMaxNR) {
        const int nr = int(std::min<int64_t>(kMaxNR, maxlen - j0));
        for (int c = 0; c < nr; c++) w[c] = sq.k.row(j0 + c) + koff;
        for (int r0 = 0; r0 < R; r0 += kMaxMR) {
          const int mr = std::min(kMaxMR, R - r0);
          for (int i = 0; i < mr; i++) x[i] = qrow[size_t(r0 + i)];
          dotk.fn(mr, nr, x, w, D, 0, D, nullptr, out);
          for (int i = 0; i < mr; i++) {
            float* srow = &scores[size_t(r0 + i) * size_t(ld)];
            for (int c = 0; c < nr; c++) srow[j0 + c] = out[i * nr + c] * d.scale;
          }
        }
      }

      if (!vec) {  // the plain loop's arithmetic: ops.h softmax, vec.h axpy
        for (int r = 0; r < R; r++) {
          float* p = &scores[size_t(r) * size_t(ld)];
          softmax(p, len[size_t(r)]);
          float* o = orow[size_t(r)];
          std::fill(o, o + D, 0.f);
          for (int64_t j = 0; j < len[size_t(r)]; j++) axpy(p[j], sq.v.row(j) + koff, o, D);
        }
        continue;
      }
      for (int r = 0; r < R; r++) softmax_row(&scores[size_t(r) * size_t(ld)], len[size_t(r)]);
      // Context: up to 4 rows share each V row over the keys they all see (lengths ascend with r);
      // each row then continues alone over the rest of its own keys.
      for (int r0 = 0; r0 < R; r0 += 4) {
        const int n4 = std::min(4, R - r0);
        const int64_t common = len[size_t(r0)];
        pv_rows(n4, &prow[size_t(r0)], 0, common, sq.v, koff, D, &orow[size_t(r0)]);
        for (int r = r0; r < r0 + n4; r++)
          if (len[size_t(r)] > common)
            pv_rows(1, &prow[size_t(r)], common, len[size_t(r)], sq.v, koff, D, &orow[size_t(r)]);
      }
    }
  });
}

void causal_attention_ref(const AttentionDims& d, const std::vector<AttentionSeq>& seqs, const float* q, float* ctx) {
  const int group = d.heads / d.kv_heads, D = d.head_dim;
  const int64_t qd = int64_t(d.heads) * D;
  for (const AttentionSeq& sq : seqs)
    for (int64_t i = 0; i < sq.n; i++)
      for (int h = 0; h < d.heads; h++) {
        const float* qh = q + (sq.t0 + i) * qd + int64_t(h) * D;
        const int64_t koff = int64_t(h / group) * D, len = sq.base + i + 1;
        std::vector<double> p(static_cast<size_t>(len));
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < len; j++) {
          double s = 0;
          for (int c = 0; c < D; c++) s += double(qh[c]) * double(sq.k.row(j)[koff + c]);
          p[size_t(j)] = s * double(d.scale);
          mx = std::max(mx, p[size_t(j)]);
        }
        for (double& x : p) sum += (x = std::exp(x - mx));
        float* o = ctx + (sq.t0 + i) * qd + int64_t(h) * D;
        for (int c = 0; c < D; c++) {
          double acc = 0;
          for (int64_t j = 0; j < len; j++) acc += p[size_t(j)] / sum * double(sq.v.row(j)[koff + c]);
          o[c] = float(acc);
        }
      }
}

}  // namespace epmoe
