#include "ep/mpi/exchange.h"

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
                  const DispatchRecordLayout& L, Fault fault, char* out) {
  for (const Record& r : records) {
    unsigned char* rec = reinterpret_cast<unsigned char*>(out);
    std::memcpy(rec, host_rows(in) + int64_t(r.token) * L.H, L.row_bytes());
    int32_t* phys = L.physical(rec);
    float* w = L.weight(rec);
    for (int k = 0; k < L.K; k++) {
      const int32_t physical = in.physical[r.token * in.K + k];
      phys[k] = serves(in, p, r, d, k) ? physical : -1;
      const float wk = in.weights[r.token * in.K + k];
      w[k] = fault == Fault::None ? wk : faulty_weight(fault, p, physical, wk);
    }
    L.set_origin(rec, r.token, src);
    out += L.bytes();
  }
}

size_t count_answers(const char* records, size_t n, const DispatchRecordLayout& L, CombineMode mode) {
  if (mode == CombineMode::Fast) return n;
  size_t a = 0;
  for (size_t i = 0; i < n; i++) {
    RecordView r = record_at(records, i, L);
    for (int k = 0; k < L.K; k++) a += r.physical(k) >= 0;
  }
  return a;
}

void serve_records(const char* records, size_t n, const DispatchRecordLayout& L, ExpertRunner& experts, CombineMode mode,
                   float* answers) {
  // The experts read each record's row in place and write one row per served (record, slot), in
  // that order; deterministic answers are exactly those rows, fast ones reduce each record's rows
  // in slot order.
  ExpertJobs jobs;
  jobs.x = records;  // the row leads the record
  jobs.x_stride = int64_t(L.bytes() / 4);
  jobs.phys = L.physical(reinterpret_cast<const unsigned char*>(records));
  jobs.phys_stride = int64_t(L.bytes() / 4);
  jobs.rows = int64_t(n);
  jobs.K = L.K;
  jobs.compact = true;
  switch (mode) {
    case CombineMode::Deterministic:
      experts.run(jobs, answers);
      return;
    case CombineMode::Fast: {
      // Grow-only scratch: fresh pages are expensive (page faults, and MPI's single-copy
      // transfers fault them in one by one), and a layer runs many times with similar sizes.
      thread_local std::vector<float> out;
      out.resize(count_answers(records, n, L, CombineMode::Deterministic) * size_t(L.H));
      experts.run(jobs, out.data());
      size_t j = 0;
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

void finish_slots(const MoeTokens& in, const Placement& p, Fault fault, int me, int64_t t0, int64_t t1, float* slot_rows,
                  float* y) {
  const int H = in.H, K = in.K;
  const int64_t n = t1 - t0;
  if (fault == Fault::None) {
    combine_slots(n, H, K, in.weights + t0 * K, slot_rows, y + t0 * H);
    return;
  }
  // The checker's bug classes (ep/fault.h), applied where the real bugs act: the weights the
  // home rank sums with, the rows it takes, the output it returns.
  thread_local std::vector<float> w;
  w.resize(size_t(n * K));
  for (int64_t t = 0; t < n; t++)
    for (int k = 0; k < K; k++)
      w[size_t(t * K + k)] = faulty_weight(fault, p, in.physical[(t0 + t) * K + k], in.weights[(t0 + t) * K + k]);
  fault_slot_rows(fault, p, me, in.physical + t0 * K, n, K, H, slot_rows);
  combine_slots(n, H, K, w.data(), slot_rows, y + t0 * H);
  const float scale = fault_output_scale(fault, p);
  if (scale != 1.0f)
    for (int64_t i = t0 * H; i < t1 * H; i++) y[i] *= scale;
}

void add_partial(const MoeTokens& in, Fault fault, int me, int d, int32_t token, int64_t t0, int64_t t1,
                 const float* partial, float* y) {
  const int64_t t = fault == Fault::None ? token : fault_partial_token(fault, me, d, token, t0, t1);
  if (t < 0) return;
  float* yt = y + t * in.H;
  for (int h = 0; h < in.H; h++) yt[h] += partial[h];
}

void finish_partials(const MoeTokens& in, const Placement& p, Fault fault, int64_t t0, int64_t t1, float* y) {
  const float scale = fault_output_scale(fault, p);
  if (scale != 1.0f)
    for (int64_t i = t0 * in.H; i < t1 * in.H; i++) y[i] *= scale;
}

void combine_answers(const MoeTokens& in, const Placement& p, const DispatchPlan& plan,
                     const std::vector<const float*>& answers, CombineMode mode, Fault fault, int me, int64_t t0,
                     int64_t t1, float* y) {
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
      finish_slots(in, p, fault, me, t0, t1, slot_rows.data(), y);
      return;
    }
    case CombineMode::Fast: {
      std::fill(y + t0 * H, y + t1 * H, 0.0f);
      for (int d = 0; d < p.ranks; d++) {
        const float* a = answers[size_t(d)];
        for (const Record& r : plan.to[size_t(d)]) {
          add_partial(in, fault, me, d, r.token, t0, t1, a, y);
          a += H;
        }
      }
      finish_partials(in, p, fault, t0, t1, y);
      return;
    }
  }
}

}  // namespace epmoe
