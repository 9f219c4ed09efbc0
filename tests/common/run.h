// Runs a command line and captures its output and exit code (for tests that drive `epmoe`).
#pragma once

#include <array>
#include <cstdio>
#include <string>
#include <sys/wait.h>

namespace epmoe::test {

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline RunResult run_command(const std::string& cmd) {
  RunResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline std::string epmoe() { return EPMOE_BINARY; }

// mpirun with what CI needs: root allowed, more ranks than cores.
inline std::string mpirun(int ranks) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
         "timeout 120 mpirun --oversubscribe -np " + std::to_string(ranks) + " ";
}

inline std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); i++) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

}  // namespace epmoe::test
