#include "ep/fault.h"

#include <cstring>

#include "ep/placement.h"
#include "util/error.h"

namespace epmoe {

namespace {
constexpr Fault kFaults[] = {Fault::DoubleReduce, Fault::SkipReduce, Fault::ReplicaPerRank, Fault::WrongCombineIds,
                             Fault::DropOverflow};
}  // namespace

std::string fault_name(Fault f) {
  switch (f) {
    case Fault::None: return "none";
    case Fault::DoubleReduce: return "double-reduce";
    case Fault::SkipReduce: return "skip-reduce";
    case Fault::ReplicaPerRank: return "replica-per-rank";
    case Fault::WrongCombineIds: return "wrong-combine-ids";
    case Fault::DropOverflow: return "drop-overflow";
  }
  return "?";
}

std::vector<std::string> fault_names() {
  std::vector<std::string> out;
  for (Fault f : kFaults) out.push_back(fault_name(f));
  return out;
}

Fault parse_fault(const std::string& name) {
  if (name.empty() || name == "none") return Fault::None;
  for (Fault f : kFaults)
    if (fault_name(f) == name) return f;
  std::string all;
  for (auto& n : fault_names()) all += (all.empty() ? "" : ", ") + n;
  throw InputError("--inject '" + name + "': unknown fault (choose one of " + all + ")");
}

float faulty_weight(Fault f, const Placement& p, int physical, float w) {
  if (f != Fault::ReplicaPerRank) return w;
  // Every replica serves the slot and every answer is summed: the slot counts once per replica.
  return w * float(p.replicas[size_t(p.logical_of[size_t(physical)])].size());
}

void fault_slot_rows(Fault f, const Placement& p, int me, const int32_t* physical, int64_t n, int K, int H,
                     float* slot_rows) {
  if (f != Fault::SkipReduce && f != Fault::WrongCombineIds) return;
  thread_local std::vector<float> moved;
  moved.assign(size_t(n * K) * size_t(H), 0.0f);
  for (int64_t t = 0; t < n; t++)
    for (int k = 0; k < K; k++) {
      const bool remote = p.owner(physical[t * K + k]) != me;
      int64_t dst = t;
      if (remote && f == Fault::SkipReduce) continue;
      if (remote && f == Fault::WrongCombineIds) dst = (t + 1) % n;
      std::memcpy(&moved[size_t((dst * K + k) * H)], &slot_rows[size_t((t * K + k) * H)], sizeof(float) * size_t(H));
    }
  if (!moved.empty()) std::memcpy(slot_rows, moved.data(), moved.size() * sizeof(float));  // n = 0: both null
}

int64_t fault_partial_token(Fault f, int me, int d, int64_t token, int64_t t0, int64_t t1) {
  if (d == me) return token;
  switch (f) {
    case Fault::SkipReduce: return -1;
    case Fault::WrongCombineIds: return t0 + (token - t0 + 1) % (t1 - t0);
    case Fault::None:
    case Fault::DoubleReduce:
    case Fault::ReplicaPerRank:
    case Fault::DropOverflow: return token;
  }
  return token;
}

float fault_output_scale(Fault f, const Placement& p) { return f == Fault::DoubleReduce ? float(p.ranks) : 1.0f; }

bool fault_drops_overflow(Fault f) { return f == Fault::DropOverflow; }

}  // namespace epmoe
