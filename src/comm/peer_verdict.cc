#include "comm/peer_verdict.h"

namespace epmoe {

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); i++) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string peer_verdict(const std::vector<PeerReport>& peers, uint64_t my_op, const char* all_answer) {
  std::vector<int> silent, with_us;
  std::string elsewhere;
  for (const PeerReport& p : peers) {
    if (!p.answered) silent.push_back(p.rank);
    else if (p.op == my_op) with_us.push_back(p.rank);
    else elsewhere += "; rank " + std::to_string(p.rank) + " waits in " + p.waits_in + " (operation " + std::to_string(p.op) + ")";
  }
  std::string v;
  if (!silent.empty())
    v = rank_list(silent) + (silent.size() == 1 ? " does" : " do") +
        " not answer (dead, hung, or stuck outside communication)";
  else
    v = all_answer;
  if (!with_us.empty()) v += "; " + rank_list(with_us) + " wait" + (with_us.size() == 1 ? "s" : "") + " in the same operation";
  return v + elsewhere;
}

}  // namespace epmoe
