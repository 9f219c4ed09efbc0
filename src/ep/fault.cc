#include "ep/fault.h"

#include "util/error.h"

namespace epmoe {

namespace {
Fault g_fault = Fault::None;
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

void set_injected_fault(Fault f) { g_fault = f; }
Fault injected_fault() { return g_fault; }

}  // namespace epmoe
