// The subcommands of `epmoe`. Each registers its flags on the CLI11 app and returns it with the
// function that runs it after parsing (exit code 0; errors are thrown as epmoe::Error).
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace epmoe {

struct Command {
  CLI::App* app;            // the subcommand, to ask whether it was chosen
  std::function<int()> run;
};

Command register_info(CLI::App& app);
Command register_score(CLI::App& app);
Command register_generate(CLI::App& app);
Command register_tokenize(CLI::App& app);
Command register_check(CLI::App& app);
Command register_synth(CLI::App& app);
Command register_serve(CLI::App& app);

}  // namespace epmoe
