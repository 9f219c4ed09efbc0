// epmoe: run Mixture-of-Experts models from Hugging Face checkpoints, with expert parallelism.
// Exit codes: 0 success, 1 a failed check, 2 bad input (file, config, flag, ids).
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "comm/communicator.h"
#include "util/error.h"

int main(int argc, char** argv) {
  using namespace epmoe;
  CLI::App app{
      "epmoe: Mixture-of-Experts inference from Hugging Face checkpoints, with expert parallelism over MPI.\n"
      "Run several ranks with: mpirun -np R epmoe <command> ... --moe-a2a-backend NAME"};
  app.require_subcommand(1);
  const std::vector<Command> commands = {register_info(app), register_score(app), register_generate(app),
                                         register_tokenize(app), register_check(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  int rc = 0;
  try {
    for (auto& c : commands)
      if (c.app->parsed()) rc = c.run();
  } catch (const Error& e) {
    std::fprintf(stderr, "epmoe: error: %s\n", e.what());
    rc = e.exit_code();
    // A failing rank must not leave its peers waiting in a collective.
    if (Communicator::world().distributed()) Communicator::world().abort_group(e.what(), rc);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "epmoe: internal error: %s\n", e.what());
    rc = 1;
    if (Communicator::world().distributed()) Communicator::world().abort_group(e.what(), rc);
  }
  Communicator::finalize();
  return rc;
}
