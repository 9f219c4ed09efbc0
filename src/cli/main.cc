// epmoe: run Mixture-of-Experts models from Hugging Face checkpoints, with expert parallelism.
// Exit codes: 0 success, 1 a failed check, 2 bad input (file, config, flag, ids).
#include <cstdio>
#include <exception>
#include <string>

#include "cli/flags.h"
#include "comm/group.h"
#include "comm/mpi_group.h"
#include "util/error.h"
#include "util/reserved_memory.h"

int main(int argc, char** argv) {
  epmoe::keep_step_buffers_in_heap();  // util/reserved_memory.h: no page faults per step
  using namespace epmoe;
  const CommandLine cl = parse_command_line(argc, argv);
  if (!cl.run) return cl.exit_code;
  // One line per failing process. Under mpirun the line names the rank, and the rank aborts the
  // group: a failing rank must not leave its peers waiting in a collective.
  auto fail = [](const std::string& what, int code) {
    // The group the engine chose; before that (bad input found early) MPI's under mpirun.
    Group& g = active_group() ? *active_group() : static_cast<Group&>(MpiGroup::world());
    if (g.distributed()) g.abort_group(what, code);
    std::fprintf(stderr, "epmoe: %s\n", what.c_str());
    return code;
  };
  int rc = 0;
  try {
    rc = cl.run();
  } catch (const Error& e) {
    rc = fail(std::string("error: ") + e.what(), e.exit_code());
  } catch (const std::exception& e) {
    rc = fail(std::string("internal error: ") + e.what(), 1);
  }
  finalize_active_group();
  return rc;
}
