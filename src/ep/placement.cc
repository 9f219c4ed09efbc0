#include "ep/placement.h"

#include <algorithm>
#include <set>

#include "io/json_util.h"
#include "util/error.h"
#include "util/hash.h"

namespace epmoe {

namespace {

void split_ranges(Placement& p) {
  const int P = p.num_physical(), R = p.ranks;
  p.rank_begin.resize(size_t(R) + 1);
  for (int r = 0; r <= R; r++) p.rank_begin[size_t(r)] = int(int64_t(P) * r / R);
}

}  // namespace

int Placement::owner(int physical) const {
  // rank_begin is ascending; the owner is the last rank whose range starts at or before it.
  // Ranks with an empty range share their begin with the next rank and are skipped by this.
  auto it = std::upper_bound(rank_begin.begin(), rank_begin.end(), physical);
  return int(it - rank_begin.begin()) - 1;
}

std::vector<int> Placement::logical_owned_by(int rank) const {
  std::set<int> s;
  for (int p = rank_begin[size_t(rank)]; p < rank_begin[size_t(rank) + 1]; p++) s.insert(logical_of[size_t(p)]);
  return {s.begin(), s.end()};
}

int Placement::choose(int logical, uint64_t token_gid, int slot) const {
  const auto& reps = replicas[size_t(logical)];
  if (reps.size() == 1) return reps[0];
  return reps[replica_index(token_gid, slot, reps.size())];
}

Placement Placement::make_default(int E, int R, int N) {
  if (R < 1) throw InputError("expert placement: the group must have at least one rank");
  if (N < 0 || N > E)
    throw InputError("--ep-redundant-experts " + std::to_string(N) + ": must be between 0 and the number of experts (" +
                     std::to_string(E) + ") without a placement file");
  Placement p;
  p.num_logical = E;
  p.ranks = R;
  p.replicas.resize(static_cast<size_t>(E));
  for (int e = 0; e < E; e++) {
    p.logical_of.push_back(e);
    p.replicas[size_t(e)].push_back(e);
  }
  for (int i = 0; i < N; i++) {
    p.logical_of.push_back(i);
    p.replicas[size_t(i)].push_back(E + i);
  }
  split_ranges(p);
  return p;
}

Placement Placement::from_file(const std::string& path, int E, int R) {
  nlohmann::json j = read_json_file(path);
  if (j.is_object() && j.contains("replicas")) j = j["replicas"];
  if (!j.is_object()) throw InputError(path + ": placement must be an object {\"logical\": [physical, ...]}");
  Placement p;
  p.num_logical = E;
  p.ranks = R;
  p.replicas.resize(static_cast<size_t>(E));
  std::set<int> used;
  int max_slot = -1;
  for (auto& [key, slots] : j.items()) {
    // Plain decimal only: std::stoi alone also takes " 1", "+1" and "01", so that "1" and "01"
    // would silently merge into one expert's slot list.
    const bool decimal = !key.empty() && key.size() <= 9 && (key.size() == 1 || key[0] != '0') &&
                         std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (!decimal) throw InputError(path + ": key '" + key + "' is not a logical expert id");
    const int e = std::stoi(key);
    if (e >= E) throw InputError(path + ": logical expert " + key + " outside 0.." + std::to_string(E - 1));
    if (!slots.is_array() || slots.empty()) throw InputError(path + ": expert " + key + " needs a non-empty list of physical slots");
    for (auto& s : slots) {
      // Range-checked as int64: get<int>() would wrap 4294967296 to slot 0.
      if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() > INT32_MAX)
        throw InputError(path + ": expert " + key + ": slots must be non-negative integers");
      const int slot = int(s.get<int64_t>());
      if (!used.insert(slot).second) throw InputError(path + ": physical slot " + std::to_string(slot) + " is assigned twice");
      p.replicas[size_t(e)].push_back(slot);
      max_slot = std::max(max_slot, slot);
    }
  }
  for (int e = 0; e < E; e++)
    if (p.replicas[size_t(e)].empty()) throw InputError(path + ": logical expert " + std::to_string(e) + " has no physical slot");
  if (int64_t(used.size()) != int64_t(max_slot) + 1)
    throw InputError(path + ": physical slots must be exactly 0.." + std::to_string(used.size() - 1) + " (found gaps)");
  p.logical_of.assign(used.size(), -1);
  for (int e = 0; e < E; e++) {
    std::sort(p.replicas[size_t(e)].begin(), p.replicas[size_t(e)].end());
    for (int s : p.replicas[size_t(e)]) p.logical_of[size_t(s)] = e;
  }
  split_ranges(p);
  return p;
}

}  // namespace epmoe
