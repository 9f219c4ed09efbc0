#include "ep/exchange.h"

#include <cstring>

#include "ep/combine.h"
#include "util/error.h"

namespace epmoe {

namespace {

// The slots of record r that rank d serves, as K flags (the one rule every side applies).
inline bool serves(const MoeTokens& in, const Placement& p, const Record& r, int d, int k) {
  if (r.slot >= 0 && r.slot != k) return false;
  return p.owner(in.physical[r.token * in.K + k]) == d;
}

}  // namespace

DispatchPlan DispatchPlan::dedup(const MoeTokens& in, const Placement& p, int64_t t0, int64_t t1) {
  DispatchPlan plan;
  plan.to.resize(size_t(p.ranks));
  std::vector<int> last(size_t(p.ranks), -1);
  for (int64_t t = t0; t < t1; t++)
    for (int k = 0; k < in.K; k++) {
      const int d = p.owner(in.physical[t * in.K + k]);
      if (last[size_t(d)] != int(t)) {
        last[size_t(d)] = int(t);
        plan.to[size_t(d)].push_back({int32_t(t), -1});
      }
    }
  return plan;
}

DispatchPlan DispatchPlan::per_slot(const MoeTokens& in, const Placement& p, int64_t t0, int64_t t1) {
  DispatchPlan plan;
  plan.to.resize(size_t(p.ranks));
  for (int64_t t = t0; t < t1; t++)
    for (int k = 0; k < in.K; k++)
      plan.to[size_t(p.owner(in.physical[t * in.K + k]))].push_back({int32_t(t), int32_t(k)});
  return plan;
}

size_t DispatchPlan::answers_from(int d, const MoeTokens& in, const Placement& p, CombineMode mode) const {
  const auto& recs = to[size_t(d)];
  switch (mode) {
    case CombineMode::Fast: return recs.size();
    case CombineMode::Deterministic: {
      size_t n = 0;
      for (auto& r : recs)
        for (int k = 0; k < in.K; k++) n += serves(in, p, r, d, k);
      return n;
    }
  }
  return 0;
}

void pack_records(const MoeTokens& in, const Placement& p, const std::vector<Record>& records, int d, int src,
                  const RecordLayout& L, char* out) {
  for (const Record& r : records) {
    int32_t* meta = reinterpret_cast<int32_t*>(out);
    meta[0] = r.token;
    meta[1] = r.slot;
    meta[2] = src;
    int32_t* phys = meta + RecordLayout::kHeader;
    float* w = reinterpret_cast<float*>(phys + L.K);
    for (int k = 0; k < L.K; k++) {
      phys[k] = serves(in, p, r, d, k) ? in.physical[r.token * in.K + k] : -1;
      w[k] = in.weights[r.token * in.K + k];
    }
    std::memcpy(meta + L.meta_words(), in.x + int64_t(r.token) * L.H, L.answer_bytes());
    out += L.record_bytes();
  }
}

size_t count_answers(const char* records, size_t n, const RecordLayout& L, CombineMode mode) {
  if (mode == CombineMode::Fast) return n;
  size_t a = 0;
  for (size_t i = 0; i < n; i++) {
    RecordView r = record_at(records, i, L);
    for (int k = 0; k < L.K; k++) a += r.physical(k) >= 0;
  }
  return a;
}

void serve_records(const char* records, size_t n, const RecordLayout& L, const ExpertFn& expert, CombineMode mode,
                   float* answers) {
  // Gather one input row per served (record, slot), run the experts grouped, then either keep the
  // rows (deterministic) or reduce each record's rows in slot order (fast).
  const size_t rows = count_answers(records, n, L, CombineMode::Deterministic);
  // Grow-only scratch: fresh pages are expensive (page faults, and MPI's single-copy transfers
  // fault them in one by one), and a layer runs many times with similar sizes.
  thread_local std::vector<float> xin, out;
  thread_local std::vector<int32_t> expert_of;
  xin.resize(rows * size_t(L.H));
  out.resize(rows * size_t(L.H));
  expert_of.resize(rows);
  size_t j = 0;
  for (size_t i = 0; i < n; i++) {
    RecordView r = record_at(records, i, L);
    for (int k = 0; k < L.K; k++)
      if (r.physical(k) >= 0) {
        std::memcpy(&xin[j * size_t(L.H)], r.row(), L.answer_bytes());
        expert_of[j++] = r.physical(k);
      }
  }
  run_experts_grouped(int64_t(rows), L.H, xin.data(), expert_of.data(), expert, out.data());
  switch (mode) {
    case CombineMode::Deterministic:
      if (rows) std::memcpy(answers, out.data(), rows * L.answer_bytes());
      return;
    case CombineMode::Fast: {
      j = 0;
      for (size_t i = 0; i < n; i++) {
        float* a = answers + i * size_t(L.H);
        std::fill(a, a + L.H, 0.0f);
        RecordView r = record_at(records, i, L);
        for (int k = 0; k < L.K; k++)
          if (r.physical(k) >= 0) {
            const float wk = r.weight(k);
            const float* y = &out[j++ * size_t(L.H)];
            for (int h = 0; h < L.H; h++) a[h] += wk * y[h];
          }
      }
      return;
    }
  }
}

void combine_answers(const MoeTokens& in, const Placement& p, const DispatchPlan& plan,
                     const std::vector<const float*>& answers, CombineMode mode, int64_t t0, int64_t t1, float* y) {
  const int H = in.H, K = in.K;
  switch (mode) {
    case CombineMode::Deterministic: {
      thread_local std::vector<float> slot_rows;
      thread_local std::vector<char> filled;
      slot_rows.resize(size_t((t1 - t0) * K) * size_t(H));
      filled.assign(size_t((t1 - t0) * K), 0);
      for (int d = 0; d < p.ranks; d++) {
        const float* a = answers[size_t(d)];
        for (const Record& r : plan.to[size_t(d)])
          for (int k = 0; k < K; k++)
            if (serves(in, p, r, d, k)) {
              const size_t slot = size_t((r.token - t0) * K + k);
              EPMOE_ASSERT(!filled[slot], "slot answered twice: token " + std::to_string(r.token) + " slot " +
                                              std::to_string(k) + " (rank " + std::to_string(d) + ")");
              filled[slot] = 1;
              std::memcpy(&slot_rows[slot * size_t(H)], a, sizeof(float) * size_t(H));
              a += H;
            }
      }
      combine_slots(t1 - t0, H, K, in.weights + t0 * K, slot_rows.data(), y + t0 * H);
      return;
    }
    case CombineMode::Fast: {
      std::fill(y + t0 * H, y + t1 * H, 0.0f);
      for (int d = 0; d < p.ranks; d++) {
        const float* a = answers[size_t(d)];
        for (const Record& r : plan.to[size_t(d)]) {
          float* yt = y + int64_t(r.token) * H;
          for (int h = 0; h < H; h++) yt[h] += a[h];
          a += H;
        }
      }
      return;
    }
  }
}

}  // namespace epmoe
