// A failing rank must take the whole group down quickly, with a message naming it: a rank that
// cannot load its experts, one that throws in the middle of a forward pass, one killed with
// SIGKILL, one that hangs. Each test runs the real `epmoe` under mpirun with a short
// --comm-timeout inside an outer `timeout`, measures how long the group took to end, and checks
// that no process of the run is left behind.
//
// The faults of a running rank come from the test-only hook EPMOE_TEST_FAULT=ACTION:RANK:OP
// (src/comm/mpi_group.h). Operation 12 of `generate` with the alltoall backend is the count
// exchange of the first MoE layer of the second decoding step, well inside a forward pass: the
// messages below check that it is an all-to-all, which only the MoE layer issues.
#include <gtest/gtest.h>

#include <chrono>
#include <dirent.h>
#include <regex>
#include <thread>

#include "common/run.h"
#include "common/scratch.h"
#include "io/safetensors.h"

namespace epmoe {
namespace {

using test::Scratch;

// Faults the group sees at once (an abort, a death noticed by mpirun) must end it long before
// the timeout, which is set high so that a slow machine (the sanitizer build) cannot make the
// test flaky. Faults only the timeout can catch (a hang) use a short one.
constexpr int kLongTimeout = 30;
constexpr int kCommTimeout = 3;

struct Timed {
  test::RunResult r;
  double seconds = 0;
};

Timed timed(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  Timed t;
  t.r = test::run_command(cmd);
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[faults] %.1f s, exit %d\n%s\n", t.seconds, t.r.exit_code, t.r.output.c_str());
  return t;
}

// Processes whose command line mentions `marker` (the test's scratch folder, unique to it).
std::vector<int> processes_mentioning(const std::string& marker) {
  std::vector<int> pids;
  DIR* proc = opendir("/proc");
  if (!proc) return pids;
  while (dirent* e = readdir(proc)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == getpid()) continue;
    std::string cmdline = test::read_file("/proc/" + std::string(e->d_name) + "/cmdline");
    for (auto& c : cmdline)
      if (c == '\0') c = ' ';
    if (cmdline.find(marker) != std::string::npos) pids.push_back(pid);
  }
  closedir(proc);
  return pids;
}

// mpirun has returned; its ranks must be gone too (allowing a moment for the kernel to reap).
void expect_no_orphans(const Scratch& s) {
  std::vector<int> left;
  for (int i = 0; i < 30; i++) {
    left = processes_mentioning(s.dir());
    if (left.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << left.size() << " process(es) of the run outlived it, e.g. pid " << left[0];
}

std::string with_fault(const std::string& fault, int ranks, const std::string& extra_mpirun = "") {
  // Ranks inherit the variable from mpirun (a local launch); `-x` would clash with the
  // mca_base_env_list that scripts/test-sanitize.sh sets.
  return "EPMOE_TEST_FAULT=" + fault + " " + test::mpirun(ranks) + extra_mpirun;
}

std::string generate_args(const std::string& model, int comm_timeout) {
  return test::epmoe() + " generate --model " + model + " --prompts-file " + test::data_dir() +
         "/demo-prompts.txt --max-new-tokens 4 --ignore-eos --moe-a2a-backend alltoall --comm-timeout " +
         std::to_string(comm_timeout);
}

// ---- a rank that cannot load its experts ----

// qwen3moe-tiny in two shards: experts 4..7 of every layer (rank 1's at R = 2) in one, the rest
// in the other.
void write_split_checkpoint(const Scratch& s) {
  const SafetensorsFile src(test::fixture("qwen3moe-tiny") + "/model.safetensors");
  const std::regex rank1_expert(R"(\.experts\.[4-7]\.)");
  std::vector<TensorToWrite> rest, experts;
  nlohmann::json index;
  for (const auto& name : src.names()) {
    const TensorView v = src.get(name);
    const bool theirs = std::regex_search(name, rank1_expert);
    (theirs ? experts : rest).push_back({name, v.dtype, v.shape, v.data});
    index["weight_map"][name] = theirs ? "experts-4-7.safetensors" : "model-rest.safetensors";
  }
  write_safetensors(s.path("model-rest.safetensors"), rest);
  write_safetensors(s.path("experts-4-7.safetensors"), experts);
  s.set_json("model.safetensors.index.json", index);
  s.remove("model.safetensors");
}

TEST(RankFaults, ShardMissingOnlyForOneRanksExperts) {
  Scratch s("qwen3moe-tiny");
  write_split_checkpoint(s);
  // The split checkpoint is the same model: same output as the fixture.
  const auto whole = test::run_command(generate_args(test::fixture("qwen3moe-tiny"), kLongTimeout));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const auto split = test::run_command(test::mpirun(2) + generate_args(s.dir(), kLongTimeout));
  ASSERT_EQ(split.exit_code, 0) << split.output;
  EXPECT_EQ(split.output, whole.output);

  s.remove("experts-4-7.safetensors");
  const Timed t = timed(test::mpirun(2) + generate_args(s.dir(), kLongTimeout));
  EXPECT_EQ(t.r.exit_code, 2);  // the failed rank's input error, through MPI_Abort
  EXPECT_NE(t.r.output.find("epmoe: rank 1: error: " + s.path("model.safetensors.index.json") +
                            ": shard 'experts-4-7.safetensors'"),
            std::string::npos);
  EXPECT_NE(t.r.output.find("is missing"), std::string::npos);
  EXPECT_EQ(t.r.output.find("rank 0: error"), std::string::npos) << "rank 0 has all it needs";
  EXPECT_LT(t.seconds, kLongTimeout) << "the failing rank aborts the group at once";
  expect_no_orphans(s);
}

// ---- a running rank that fails ----

// The scratch copy of the fixture gives the ranks' command lines a marker of their own, for the
// orphan check.

TEST(RankFaults, ThrowInForwardPassAbortsTheGroup) {
  Scratch s("qwen3moe-tiny");
  const Timed t = timed(with_fault("throw:1:13", 3) + generate_args(s.dir(), kLongTimeout));
  EXPECT_EQ(t.r.exit_code, 1);
  EXPECT_NE(t.r.output.find("epmoe: rank 1: error: EPMOE_TEST_FAULT: injected failure on entering all-to-all "
                            "(operation 13)"),
            std::string::npos);
  EXPECT_LT(t.seconds, kLongTimeout) << "the failing rank aborts the group at once";
  expect_no_orphans(s);
}

TEST(RankFaults, SigkilledRankEndsTheJob) {
  Scratch s("qwen3moe-tiny");
  const Timed t = timed(with_fault("kill:1:13", 3) + generate_args(s.dir(), kLongTimeout));
  EXPECT_NE(t.r.exit_code, 0);
  EXPECT_NE(t.r.output.find("rank 1 kills itself (SIGKILL) on entering all-to-all"), std::string::npos);
  // mpirun sees the signal, names the rank and ends the others.
  EXPECT_TRUE(std::regex_search(t.r.output, std::regex("process rank 1 .*(signal 9|Killed)"))) << t.r.output;
  EXPECT_LT(t.seconds, kLongTimeout);
  expect_no_orphans(s);
}

// When the launcher keeps the survivors running (--enable-recovery: it neither kills them nor
// tells them), the survivor's own deadline ends the job: after --comm-timeout it asks the group
// who is missing and names rank 1. With two ranks the survivor's line is certain to be printed:
// no other rank can abort it first.
TEST(RankFaults, SigkilledRankIsNamedBySurvivorsAfterTheTimeout) {
  Scratch s("qwen3moe-tiny");
  const Timed t = timed(with_fault("kill:1:13", 2, "--enable-recovery ") + generate_args(s.dir(), kCommTimeout));
  EXPECT_NE(t.r.output.find("epmoe: rank 0: all-to-all (operation 13): no answer from the group for " +
                            std::to_string(kCommTimeout) +
                            " s (--comm-timeout): rank 1 does not answer (dead, hung, or stuck outside communication)"),
            std::string::npos);
  EXPECT_GE(t.seconds, kCommTimeout);
  EXPECT_LT(t.seconds, kCommTimeout + 10) << "timeout + a grace period of at most 5 s + start-up";
  expect_no_orphans(s);
}

// A hung rank answers nothing; the ranks waiting for it time out, find it by the status query,
// and tell it apart from a peer that waits with them.
TEST(RankFaults, HungRankIsNamedAfterTheTimeout) {
  Scratch s("qwen3moe-tiny");
  const Timed t = timed(with_fault("hang:1:13", 3) + generate_args(s.dir(), kCommTimeout));
  EXPECT_EQ(t.r.exit_code, 1);
  EXPECT_NE(t.r.output.find("rank 1 hangs on entering all-to-all (operation 13)"), std::string::npos);
  // Ranks 0 and 2 time out together; the first to abort may end the other before it prints.
  EXPECT_TRUE(std::regex_search(
      t.r.output, std::regex("epmoe: rank [02]: all-to-all \\(operation 13\\): no answer from the group for " +
                             std::to_string(kCommTimeout) +
                             " s \\(--comm-timeout\\): rank 1 does not answer \\(dead, hung, or stuck outside "
                             "communication\\); rank [02] waits in the same operation")))
      << t.r.output;
  EXPECT_GE(t.seconds, kCommTimeout);
  EXPECT_LT(t.seconds, kCommTimeout + 10);
  expect_no_orphans(s);
}

// A hook value that cannot be read is refused, not ignored: a test that meant to inject a fault
// must not pass because nothing was injected.
TEST(RankFaults, MalformedFaultHookIsAnInputError) {
  Scratch s("qwen3moe-tiny");
  const auto r = test::run_command(with_fault("explode:1:12", 2) + generate_args(s.dir(), kLongTimeout));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("EPMOE_TEST_FAULT='explode:1:12': expected ACTION:RANK:OP"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace epmoe
