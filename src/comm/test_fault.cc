#include "comm/test_fault.h"
#include "util/env.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "util/error.h"

namespace epmoe {

namespace {

struct TestFault {
  enum Kind { None, Throw, Kill, Hang } kind = None;
  int rank = -1;
  uint64_t op = 0;
};
TestFault g_fault;

bool parse_test_fault(TestFault& f) {
  const char* v = env_get("EPMOE_TEST_FAULT");
  if (!v) return true;
  const std::string s = v;
  const size_t a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
  if (b == std::string::npos) return false;
  const std::string kind = s.substr(0, a);
  if (kind == "throw") f.kind = TestFault::Throw;
  else if (kind == "kill") f.kind = TestFault::Kill;
  else if (kind == "hang") f.kind = TestFault::Hang;
  else return false;
  try {
    f.rank = std::stoi(s.substr(a + 1, b - a - 1));
    f.op = std::stoull(s.substr(b + 1));
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

}  // namespace

std::string arm_test_fault() {
  if (parse_test_fault(g_fault)) return "";
  return std::string("error: EPMOE_TEST_FAULT='") + env_get("EPMOE_TEST_FAULT") +
         "': expected ACTION:RANK:OP with ACTION throw, kill or hang";
}

void test_fault_point(int rank, uint64_t op_count, const char* op) {
  if (g_fault.kind == TestFault::None || g_fault.rank != rank || g_fault.op != op_count) return;
  const std::string where = std::string(op) + " (operation " + std::to_string(op_count) + ")";
  switch (g_fault.kind) {
    case TestFault::None: break;
    case TestFault::Throw: throw Error("EPMOE_TEST_FAULT: injected failure on entering " + where);
    case TestFault::Kill:
      std::fprintf(stderr, "EPMOE_TEST_FAULT: rank %d kills itself (SIGKILL) on entering %s\n", rank, where.c_str());
      std::fflush(stderr);
      std::raise(SIGKILL);
      break;
    case TestFault::Hang:
      std::fprintf(stderr, "EPMOE_TEST_FAULT: rank %d hangs on entering %s\n", rank, where.c_str());
      std::fflush(stderr);
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

}  // namespace epmoe
