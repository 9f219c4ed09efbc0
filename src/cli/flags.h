// `epmoe`'s command line: every subcommand's flags and their help, parsed into the structs of
// cli/commands.h.
//
// Why one source: CLI11 (2.1, as Debian ships it) is header-only, with namespace-scope validator
// objects and their inline code. Each source that includes it compiles ~100 KB of object code
// before using anything: 10 s at -O2 -g, 20 s under ASan on CI's cores. So only cli/flags.cc
// includes it, and the commands take plain structs.
#pragma once

#include <functional>

namespace epmoe {

// What the command line asks for: the chosen command, ready to run; or, when `run` is empty, the
// code to exit with (0 after --help; 2 after a bad flag, which CLI11 has already reported).
struct CommandLine {
  std::function<int()> run;
  int exit_code = 0;
};

CommandLine parse_command_line(int argc, char** argv);

}  // namespace epmoe
