// Test-only fault hook: EPMOE_TEST_FAULT=ACTION:RANK:OP makes rank RANK, on entering its OP-th
// collective (1-based, counted from the start), do ACTION: `throw` (an epmoe::Error, as a bug in
// the forward pass would), `kill` (SIGKILL itself) or `hang` (sleep forever). The MPI group reads
// it once at start-up and calls the hook on entering every collective; tests/cli/rank_faults_test.cc
// uses it to prove that the group fails fast and names the rank. Never set it in production.
#pragma once

#include <cstdint>
#include <string>

namespace epmoe {

// Reads EPMOE_TEST_FAULT. Returns the input error to report when it is set but unreadable (a test
// that meant to inject a fault must not pass because nothing was injected), else "".
std::string arm_test_fault();

// Does the armed fault when `rank` enters its `op_count`-th collective, `op`; else nothing.
void test_fault_point(int rank, uint64_t op_count, const char* op);

}  // namespace epmoe
