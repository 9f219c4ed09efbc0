#include "check/audit.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "check/probe.h"
#include "moe/moe_layer.h"
#include "tensor/device_buffer.h"
#include "util/error.h"

namespace epmoe {

namespace {

// The diagnoses, in the order a verdict lists them.
const char* const kDiagnoses[] = {"reduced twice", "not reduced (remote slots missing)", "replica counted twice",
                                  "slot lost", "rows of another token", "wrong weights",
                                  "nothing arrived, no local slot (slot lost or not reduced)",
                                  "right sum, not bit-identical (summation order)"};
// A token whose every slot is remote and that received nothing fits two bug classes alike; it
// fails the check but never names the bug (listed last, whatever its count). With top-2 routing
// and experts on three ranks about half the tokens are like that (deepseek-v3-fp8-tiny).
const char* const kAmbiguous = kDiagnoses[6];

bool near(double a, double b, double tol) { return std::fabs(a - b) <= tol * std::max(1.0, std::fabs(b)); }

// What a token's output says about the reduction. y = c * x must hold for one scalar c (else the
// rows belong to another token); c is then matched against what each bug class would give.
std::string diagnose(const float* x, const float* y, int H, double c_ok, double c_double,
                     double c_local, double c_replicas, const std::vector<double>& c_slot_lost) {
  double xy = 0, xx = 0, yy = 0;
  for (int h = 0; h < H; h++) {
    xy += double(x[h]) * y[h];
    xx += double(x[h]) * x[h];
    yy += double(y[h]) * y[h];
  }
  const double c = xy / xx;
  double resid = 0;
  for (int h = 0; h < H; h++) resid = std::max(resid, std::fabs(double(y[h]) - c * x[h]));
  if (!std::isfinite(c) || resid > 1e-3 * std::max(1.0, std::sqrt(yy / H))) return "rows of another token";
  const double tol = 1e-4;
  if (near(c, c_ok, tol)) return "ok";
  if (near(c, c_double, tol)) return "reduced twice";
  if (near(c, 0.0, tol)) return near(c_local, 0.0, tol) ? kAmbiguous : "slot lost";  // nothing arrived
  if (near(c, c_local, tol)) return "not reduced (remote slots missing)";
  if (near(c, c_replicas, tol)) return "replica counted twice";
  for (double s : c_slot_lost)
    if (near(c, s, tol)) return "slot lost";
  return "wrong weights";
}

}  // namespace

AuditOptions make_audit_options(int hidden_size, int top_k, const BackendOptions& bo, int ranks) {
  AuditOptions ao;
  ao.H = hidden_size;
  ao.K = top_k;
  ao.tokens_per_rank = int64_t(bo.max_dispatch_tokens_per_rank) + 5;
  if (bo.max_tokens_per_rank > 0)
    ao.tokens_per_rank = std::min<int64_t>(ao.tokens_per_rank, int64_t(bo.max_tokens_per_rank) - 3 * (ranks - 1));
  if (ao.tokens_per_rank < 1)
    throw InputError("--audit with --max-batch-tokens " + std::to_string(bo.max_tokens_per_rank) +
                     ": too few tokens a step for the audit's " + std::to_string(ranks) + " ranks (at least " +
                     std::to_string(3 * ranks - 2) + ")");
  ao.exact = bo.combine == CombineMode::Deterministic;
  return ao;
}

AuditTokens make_audit_tokens(const Placement& p, int me, int R, const AuditOptions& opt) {
  AuditTokens tok;
  const int H = opt.H, K = opt.K, E = p.num_logical;
  int64_t T = opt.tokens_per_rank + 3 * me;
  if (R >= 3 && me == R - 1) T = 0;  // a rank without tokens still takes part
  tok.T = T, tok.H = H, tok.K = K;
  std::mt19937_64 rng(opt.seed * 1000003 + uint64_t(me));
  std::uniform_real_distribution<float> mag(0.5f, 1.5f), wdist(0.05f, 1.0f);
  tok.x.resize(size_t(T * H));
  tok.w.resize(size_t(T * K));
  tok.logical.resize(size_t(T * K));
  tok.physical.resize(size_t(T * K));
  for (auto& v : tok.x) v = (rng() & 1 ? 1.f : -1.f) * mag(rng);
  std::vector<int> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; t++) {
    for (int e = 0; e < E; e++) perm[size_t(e)] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < K; k++) {
      tok.logical[size_t(t * K + k)] = perm[size_t(k)];
      tok.physical[size_t(t * K + k)] = p.choose(perm[size_t(k)], token_gid(uint64_t(me), uint64_t(t)), k);
      tok.w[size_t(t * K + k)] = wdist(rng);
    }
  }
  return tok;
}

// Probe experts: expert e scales its rows by (e + 1), so that every expert leaves its mark.
float audit_probe_scale(const Placement& p, int phys) { return float(p.logical_of[size_t(phys)] + 1); }

namespace {

// This rank's verdicts: counts per diagnosis (the last entry: ok), the worst relative error.
struct AuditTally {
  std::vector<int64_t> counts;
  int64_t tokens = 0;
  double max_rel_error = 0;
};

AuditTally tally_audit(const Placement& p, int me, int R, const AuditTokens& tok, const float* y, const float* exact_ref,
                       bool exact) {
  const int H = tok.H, K = tok.K;
  AuditTally tally;
  tally.counts.assign(std::size(kDiagnoses) + 1, 0);  // last: ok
  tally.tokens = tok.T;
  std::vector<float> expect(static_cast<size_t>(H));
  for (int64_t t = 0; t < tok.T; t++) {
    const float* xt = &tok.x[size_t(t * H)];
    const float* yt = &y[size_t(t * H)];
    // The local formula, in slot order in fp32: the deterministic combine must match it bit for bit.
    std::fill(expect.begin(), expect.end(), 0.f);
    double c_ok = 0, c_local = 0, c_rep = 0;
    std::vector<double> c_lost;
    for (int k = 0; k < K; k++) {
      const float wk = tok.w[size_t(t * K + k)];
      const int e = tok.logical[size_t(t * K + k)];
      for (int h = 0; h < H; h++) expect[size_t(h)] += wk * (float(e + 1) * xt[h]);
      const double part = double(wk) * (e + 1);
      c_ok += part;
      if (p.owner(tok.physical[size_t(t * K + k)]) == me) c_local += part;
      c_rep += part * double(p.replicas[size_t(e)].size());
    }
    for (int k = 0; k < K; k++)
      c_lost.push_back(c_ok - double(tok.w[size_t(t * K + k)]) * (tok.logical[size_t(t * K + k)] + 1));
    double err = 0;
    for (int h = 0; h < H; h++)
      err = std::max(err, std::fabs(double(yt[h]) - expect[size_t(h)]) / std::max(1e-30, std::fabs(double(expect[size_t(h)]))));
    if (!std::isfinite(err)) err = INFINITY;
    tally.max_rel_error = std::max(tally.max_rel_error, err);
    const float* bits = exact_ref ? &exact_ref[size_t(t * H)] : expect.data();
    const bool ok = exact ? std::equal(yt, yt + H, bits) : err <= 1e-5;
    std::string d = ok ? "ok" : diagnose(xt, yt, H, c_ok, c_ok * R, c_local, c_rep, c_lost);
    if (d == "ok" && !ok) d = kDiagnoses[std::size(kDiagnoses) - 1];  // within 1e-4, yet not exact
    size_t i = 0;
    while (i < std::size(kDiagnoses) && d != kDiagnoses[i]) i++;
    tally.counts[i]++;
  }
  return tally;
}

// The verdict over all ranks from each rank's tally (collective).
AuditResult audit_result(AuditTally all, Group& group) {
  for (auto& c : all.counts) c = group.allreduce_sum(c);  // everyone's counts, everywhere
  AuditResult res;
  const auto& counts = all.counts;
  res.tokens = group.allreduce_sum(all.tokens);
  res.max_rel_error = group.allreduce_max_f64(all.max_rel_error);
  res.pass = counts[std::size(kDiagnoses)] == res.tokens;
  for (size_t i = 0; i < std::size(kDiagnoses); i++)
    if (counts[i]) res.counts[kDiagnoses[i]] = counts[i];
  res.counts["ok"] = counts[std::size(kDiagnoses)];
  if (res.pass) {
    res.verdict = "ok";
  } else {
    // Most frequent diagnosis first: it names the bug; the rest are tokens where bugs look alike.
    std::vector<size_t> order;
    for (size_t i = 0; i < std::size(kDiagnoses); i++)
      if (counts[i]) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const bool amb_a = kDiagnoses[a] == kAmbiguous, amb_b = kDiagnoses[b] == kAmbiguous;
      return amb_a != amb_b ? amb_b : counts[a] > counts[b];
    });
    for (size_t i : order)
      res.verdict += (res.verdict.empty() ? "" : ", ") + std::string(kDiagnoses[i]) + " (" + std::to_string(counts[i]) +
                     "/" + std::to_string(res.tokens) + " tokens)";
  }
  return res;
}

}  // namespace

AuditResult run_audit(Group& group, Device device, const Placement& p, A2ABackend& backend, const AuditOptions& opt) {
  const int R = group.size(), me = group.rank();
  const AuditTokens tok = make_audit_tokens(p, me, R, opt);
  const size_t n = size_t(tok.T) * size_t(tok.H);
  DeviceBuffer x = DeviceBuffer::of(device, tok.x), w = DeviceBuffer::of(device, tok.w);
  DeviceBuffer phys = DeviceBuffer::of(device, tok.physical), logical = DeviceBuffer::of(device, tok.logical);
  DeviceBuffer y(device, n * sizeof(float)), y_ref(device, n * sizeof(float));
  y.fill(0xff);  // NaN: rows a backend never writes show up
  y_ref.fill(0xff);
  MoeTokens in;
  in.device = device;
  in.act = DType::F32;  // probe outputs are exact in fp32
  in.T = tok.T, in.H = tok.H, in.K = tok.K;
  in.x = x.data(), in.physical = phys.as<int32_t>(), in.weights = w.as<float>();
  {
    // The reference bits: every expert local (the solo placement takes logical ids as physical).
    const Placement solo = Placement::make_default(p.num_logical, 1, 0);
    auto all = make_probe_runner(device, solo, 0, tok.H);
    MoeTokens li = in;
    li.physical = logical.as<int32_t>();
    make_local_backend(device, solo)->run(li, *all, y_ref.as<float>());
  }
  auto mine = make_probe_runner(device, p, me, tok.H);
  backend.run(in, *mine, y.as<float>());
  group.wait_device("check: reduction audit");
  std::vector<float> yh(n), refh(n);
  y.download(yh.data(), n * sizeof(float));
  y_ref.download(refh.data(), n * sizeof(float));
  return audit_result(tally_audit(p, me, R, tok, yh.data(), refh.data(), opt.exact), group);
}

}  // namespace epmoe
