// Expert placement (src/ep/placement.h): contiguous rank ranges, redundant replicas, the replica
// choice (a pure function of token and slot, so that a token-slot is served exactly once whichever
// rank routes it), and the placement file with its error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "ep/placement.h"
#include "util/error.h"

namespace epmoe {
namespace {

// Invariants of any placement: the rank ranges tile [0, P) in order, each physical slot has one
// owner, logical_of and replicas are inverse to each other, and every logical expert has a slot.
void expect_consistent(const Placement& p) {
  const int P = p.num_physical(), R = p.ranks;
  ASSERT_EQ(p.rank_begin.size(), size_t(R) + 1);
  EXPECT_EQ(p.rank_begin.front(), 0);
  EXPECT_EQ(p.rank_begin.back(), P);
  int total = 0;
  for (int r = 0; r < R; r++) {
    EXPECT_LE(p.rank_begin[size_t(r)], p.rank_begin[size_t(r) + 1]) << "rank " << r;
    EXPECT_GE(p.num_local(r), 0);
    total += p.num_local(r);
    // Balanced: P*r/R boundaries give every rank floor(P/R) or ceil(P/R) slots.
    EXPECT_GE(p.num_local(r), P / R) << "rank " << r;
    EXPECT_LE(p.num_local(r), (P + R - 1) / R) << "rank " << r;
    for (int s = p.first_local(r); s < p.first_local(r) + p.num_local(r); s++) EXPECT_EQ(p.owner(s), r) << "slot " << s;
    // Logical experts a rank needs weights for: exactly those of its slots, deduplicated, ascending.
    std::set<int> want;
    for (int s = p.first_local(r); s < p.first_local(r) + p.num_local(r); s++) want.insert(p.logical_of[size_t(s)]);
    EXPECT_EQ(p.logical_owned_by(r), std::vector<int>(want.begin(), want.end())) << "rank " << r;
  }
  EXPECT_EQ(total, P);  // every physical expert exactly once
  ASSERT_EQ(p.replicas.size(), size_t(p.num_logical));
  std::vector<int> seen(static_cast<size_t>(P), 0);
  for (int e = 0; e < p.num_logical; e++) {
    const auto& reps = p.replicas[size_t(e)];
    EXPECT_FALSE(reps.empty()) << "expert " << e;
    EXPECT_TRUE(std::is_sorted(reps.begin(), reps.end())) << "expert " << e;
    for (int s : reps) {
      ASSERT_GE(s, 0);
      ASSERT_LT(s, P);
      EXPECT_EQ(p.logical_of[size_t(s)], e) << "slot " << s;
      seen[size_t(s)]++;
    }
  }
  for (int s = 0; s < P; s++) EXPECT_EQ(seen[size_t(s)], 1) << "slot " << s;
}

TEST(Placement, DefaultRangesCoverEveryExpertOnce) {
  for (int R = 1; R <= 5; R++) {
    SCOPED_TRACE("R=" + std::to_string(R));
    const Placement p = Placement::make_default(8, R, 0);
    EXPECT_EQ(p.num_physical(), 8);
    expect_consistent(p);
    for (int s = 0; s < 8; s++) EXPECT_EQ(p.logical_of[size_t(s)], s);  // identity without replicas
  }
  // 8 experts on 3 ranks, by the formula [8r/3, 8(r+1)/3): 0..1, 2..4, 5..7.
  const Placement p = Placement::make_default(8, 3, 0);
  EXPECT_EQ(p.rank_begin, (std::vector<int>{0, 2, 5, 8}));
  EXPECT_EQ(p.owner(1), 0);
  EXPECT_EQ(p.owner(2), 1);
  EXPECT_EQ(p.owner(7), 2);
}

// More ranks than physical experts: some ranks own nothing; the owner of each slot is the one
// rank whose (non-empty) range holds it.
TEST(Placement, MoreRanksThanExpertsLeavesSomeRanksEmpty) {
  for (int R : {3, 4, 5, 7}) {
    SCOPED_TRACE("R=" + std::to_string(R));
    const Placement p = Placement::make_default(2, R, 0);
    expect_consistent(p);
    int empty = 0;
    for (int r = 0; r < R; r++) {
      empty += p.num_local(r) == 0;
      if (p.num_local(r) == 0) {
        EXPECT_TRUE(p.logical_owned_by(r).empty());
      }
    }
    EXPECT_EQ(empty, R - 2);
  }
}

TEST(Placement, RedundantExpertsReplicateTheFirstN) {
  for (int N : {2, 5})
    for (int R = 1; R <= 5; R++) {
      SCOPED_TRACE("N=" + std::to_string(N) + " R=" + std::to_string(R));
      const Placement p = Placement::make_default(8, R, N);
      EXPECT_EQ(p.num_physical(), 8 + N);
      expect_consistent(p);
      for (int i = 0; i < N; i++) {
        EXPECT_EQ(p.logical_of[size_t(8 + i)], i);  // physical E + i serves logical i
        EXPECT_EQ(p.replicas[size_t(i)], (std::vector<int>{i, 8 + i}));
      }
      for (int e = N; e < 8; e++) EXPECT_EQ(p.replicas[size_t(e)], std::vector<int>{e});
    }
}

TEST(Placement, DefaultRejectsBadArguments) {
  EXPECT_THROW(Placement::make_default(8, 0, 0), InputError);
  EXPECT_THROW(Placement::make_default(8, 2, 9), InputError);  // more replicas than experts
  EXPECT_THROW(Placement::make_default(8, 2, -1), InputError);
}

// The replica is a function of (token_gid, slot) only: placements built for different group sizes
// (what different ranks, or different EP runs, hold) answer the same, and always with a slot of
// the requested logical expert.
TEST(Placement, ChooseIsAPureFunctionOfTokenAndSlot) {
  std::vector<Placement> ps;
  for (int R = 1; R <= 5; R++) ps.push_back(Placement::make_default(8, R, 5));
  for (uint64_t gid = 0; gid < 2000; gid++)
    for (int slot = 0; slot < 8; slot++)
      for (int e = 0; e < 8; e++) {
        const int c = ps[0].choose(e, gid, slot);
        ASSERT_EQ(ps[0].logical_of[size_t(c)], e) << "gid " << gid << " slot " << slot;
        ASSERT_EQ(ps[0].choose(e, gid, slot), c);  // repeatable
        for (const Placement& q : ps) ASSERT_EQ(q.choose(e, gid, slot), c) << "R=" << q.ranks;
      }
}

// Each replica takes a fair share of the tokens (1/2 expected for two replicas; the binomial
// standard deviation over 10000 tokens is 0.5%, so [40%, 60%] fails only on a real bias), for
// every slot, and for a single slot across consecutive token ids.
TEST(Placement, ChooseSpreadsLoadOverReplicas) {
  const Placement p = Placement::make_default(8, 3, 5);
  for (int e = 0; e < 5; e++)
    for (int slot = 0; slot < 8; slot++) {
      int first = 0;
      for (uint64_t gid = 0; gid < 10000; gid++) first += p.choose(e, gid, slot) == e;
      EXPECT_GE(first, 4000) << "expert " << e << " slot " << slot;
      EXPECT_LE(first, 6000) << "expert " << e << " slot " << slot;
    }
}

// ---------------------------------------------------------------- placement files

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path =
      ::testing::TempDir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Placement, FromFileValid) {
  // 4 logical experts in 6 slots; expert 0 has three replicas (listed out of order), expert 2 two.
  const std::string path = write_file("ok.json", R"({"replicas": {"0": [5, 0, 3], "1": [1], "2": [2, 4], "3": [6]}})");
  const Placement p = Placement::from_file(path, 4, 3);
  EXPECT_EQ(p.num_physical(), 7);
  EXPECT_EQ(p.replicas[0], (std::vector<int>{0, 3, 5}));
  EXPECT_EQ(p.logical_of, (std::vector<int>{0, 1, 2, 0, 2, 0, 3}));
  EXPECT_EQ(p.rank_begin, (std::vector<int>{0, 2, 4, 7}));  // [7r/3, 7(r+1)/3)
  expect_consistent(p);

  // The bare form (no "replicas" wrapper) means the same.
  const std::string bare = write_file("bare.json", R"({"0": [5, 0, 3], "1": [1], "2": [2, 4], "3": [6]})");
  const Placement q = Placement::from_file(bare, 4, 3);
  EXPECT_EQ(q.logical_of, p.logical_of);
  EXPECT_EQ(q.replicas, p.replicas);

  // Three replicas share the load about equally (1/3 each; 0.47% standard deviation).
  int count[7] = {};
  for (uint64_t gid = 0; gid < 10000; gid++) count[p.choose(0, gid, 1)]++;
  for (int s : {0, 3, 5}) {
    EXPECT_GE(count[s], 2800) << "slot " << s;
    EXPECT_LE(count[s], 3900) << "slot " << s;
  }
}

// Every malformed file is an InputError whose message names the file (and what is wrong).
TEST(Placement, FromFileRejectsInvalidFiles) {
  struct Bad { const char* name; const char* json; const char* says; };
  const Bad cases[] = {
      {"twice", R"({"0": [0, 1], "1": [1], "2": [2]})", "assigned twice"},
      {"no_slots_missing", R"({"0": [0], "2": [1]})", "no physical slot"},
      {"no_slots_empty", R"({"0": [0], "1": [], "2": [1]})", "non-empty"},
      {"gap", R"({"0": [0], "1": [1], "2": [3]})", "gaps"},
      {"key_word", R"({"0": [0], "one": [1], "2": [2]})", "not a logical expert id"},
      {"key_fraction", R"({"0": [0], "1.5": [1], "2": [2]})", "not a logical expert id"},
      {"key_suffix", R"({"0": [0], "1x": [1], "2": [2]})", "not a logical expert id"},
      // Integer-looking but not plain decimal: std::stoi would take these, and "01" next to "1"
      // would merge two entries into one expert.
      {"key_space", R"({"0": [0], " 1": [1], "2": [2]})", "not a logical expert id"},
      {"key_plus", R"({"0": [0], "+1": [1], "2": [2]})", "not a logical expert id"},
      {"key_leading_zero", R"({"0": [0], "1": [1], "01": [3], "2": [2]})", "not a logical expert id"},
      {"key_negative", R"({"0": [0], "-1": [1], "2": [2]})", "not a logical expert id"},
      {"key_range", R"({"0": [0], "1": [1], "3": [2]})", "outside"},
      // 2^32 would wrap to slot 0 if read as int, and the file would pass with slot 0 twice over.
      {"slot_huge", R"({"0": [4294967296], "1": [1], "2": [2]})", "non-negative integers"},
      {"slot_negative", R"({"0": [0], "1": [-1], "2": [2]})", "non-negative integers"},
      {"slot_float", R"({"0": [0], "1": [1.5], "2": [2]})", "non-negative integers"},
      {"slot_string", R"({"0": [0], "1": ["1"], "2": [2]})", "non-negative integers"},
      {"not_object", R"([[0], [1], [2]])", "must be an object"},
      {"invalid_json", R"({"0": [0], "1": [1],)", ""},
  };
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.name);
    const std::string path = write_file(std::string(b.name) + ".json", b.json);
    try {
      Placement::from_file(path, 3, 2);
      ADD_FAILURE() << "accepted " << b.json;
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(b.says), std::string::npos) << msg;
    }
  }
  // A file that does not exist is an input error naming it too.
  const std::string missing = ::testing::TempDir() + "/no_such_placement.json";
  try {
    Placement::from_file(missing, 3, 2);
    ADD_FAILURE() << "accepted a missing file";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace epmoe
