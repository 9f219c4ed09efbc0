#include "ep/exchange.h"

#include <cstring>

#include "ep/combine.h"
#include "ep/fault.h"
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
      w[k] = packed_weight(in, p, r.token, k);
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

float packed_weight(const MoeTokens& in, const Placement& p, int64_t t, int k) {
  const float w = in.weights[t * in.K + k];
  if (injected_fault() != Fault::ReplicaPerRank) return w;
  // Every replica serves the slot and every answer is summed: the slot counts once per replica.
  return w * float(p.replicas[size_t(p.logical_of[size_t(in.physical[t * in.K + k])])].size());
}

void finish_slots(const MoeTokens& in, const Placement& p, int me, int64_t t0, int64_t t1, float* slot_rows, float* y) {
  const int H = in.H, K = in.K;
  const int64_t n = t1 - t0;
  const Fault fault = injected_fault();
  const float* weights = in.weights + t0 * K;
  thread_local std::vector<float> faulty_w, moved;
  if (fault != Fault::None) {
    faulty_w.resize(size_t(n * K));
    for (int64_t t = 0; t < n; t++)
      for (int k = 0; k < K; k++) faulty_w[size_t(t * K + k)] = packed_weight(in, p, t0 + t, k);
    weights = faulty_w.data();
    if (fault == Fault::SkipReduce || fault == Fault::WrongCombineIds) {
      // Rows served by another rank: dropped, or written one token further on.
      moved.assign(size_t(n * K) * size_t(H), 0.0f);
      for (int64_t t = 0; t < n; t++)
        for (int k = 0; k < K; k++) {
          const bool remote = p.owner(in.physical[(t0 + t) * K + k]) != me;
          int64_t dst = t;
          if (remote && fault == Fault::SkipReduce) continue;
          if (remote && fault == Fault::WrongCombineIds) dst = (t + 1) % n;
          std::memcpy(&moved[size_t((dst * K + k) * H)], &slot_rows[size_t((t * K + k) * H)], sizeof(float) * size_t(H));
        }
      if (!moved.empty()) std::memcpy(slot_rows, moved.data(), moved.size() * sizeof(float));  // n = 0: both null
    }
  }
  combine_slots(n, H, K, weights, slot_rows, y + t0 * H);
  if (fault == Fault::DoubleReduce)
    for (int64_t i = t0 * H; i < t1 * H; i++) y[i] *= float(p.ranks);
}

void add_partial(const MoeTokens& in, int me, int d, int32_t token, int64_t t0, int64_t t1, const float* partial,
                 float* y) {
  const Fault fault = injected_fault();
  if (d != me && fault == Fault::SkipReduce) return;
  int64_t t = token;
  if (d != me && fault == Fault::WrongCombineIds) t = t0 + (token - t0 + 1) % (t1 - t0);
  float* yt = y + t * in.H;
  for (int h = 0; h < in.H; h++) yt[h] += partial[h];
}

void finish_partials(const MoeTokens& in, const Placement& p, int64_t t0, int64_t t1, float* y) {
  if (injected_fault() == Fault::DoubleReduce)
    for (int64_t i = t0 * in.H; i < t1 * in.H; i++) y[i] *= float(p.ranks);
}

void combine_answers(const MoeTokens& in, const Placement& p, const DispatchPlan& plan,
                     const std::vector<const float*>& answers, CombineMode mode, int me, int64_t t0, int64_t t1,
                     float* y) {
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
      finish_slots(in, p, me, t0, t1, slot_rows.data(), y);
      return;
    }
    case CombineMode::Fast: {
      std::fill(y + t0 * H, y + t1 * H, 0.0f);
      for (int d = 0; d < p.ranks; d++) {
        const float* a = answers[size_t(d)];
        for (const Record& r : plan.to[size_t(d)]) {
          add_partial(in, me, d, r.token, t0, t1, a, y);
          a += H;
        }
      }
      finish_partials(in, p, t0, t1, y);
      return;
    }
  }
}

}  // namespace epmoe
