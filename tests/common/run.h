// Runs a command line and captures its output and exit code (for tests that drive `epmoe`).
#pragma once

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <sys/wait.h>
#include <vector>

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

// This test process's own folder for Open MPI's session directories, removed when it exits.
// Why: every mpirun on a host shares `$TMPDIR/ompi.<host>.<uid>/` and the one that finishes last
// removes it when empty -- while a concurrent mpirun (ctest -j) is between creating it and
// creating its `pid.<N>/` below it. That mpirun then fails ("A call to mkdir was unable to create
// the desired directory"), a flake that failed CI once. One base a process (its mpiruns run one
// after another) leaves nothing to share. Open MPI 4 reads orte_tmpdir_base, 5 (PRRTE) prte_'s.
inline const std::string& mpi_session_base() {
  struct Base {
    std::string path;
    Base() {
      const char* tmp = std::getenv("TMPDIR");
      std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/epmoe-ompi-XXXXXX";
      if (mkdtemp(templ.data())) path = templ;  // on failure: mpirun's own default
    }
    ~Base() {
      std::error_code ec;
      if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
  };
  static const Base base;
  return base.path;
}

// mpirun with what CI needs: root allowed, more ranks than cores, a session folder of its own.
inline std::string mpirun(int ranks) {
  const std::string& base = mpi_session_base();
  const std::string session = base.empty() ? "" : "OMPI_MCA_orte_tmpdir_base=" + base + " PRTE_MCA_prte_tmpdir_base=" + base + " ";
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 " + session +
         "timeout 120 mpirun --oversubscribe -np " + std::to_string(ranks) + " ";
}

inline std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); i++) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

}  // namespace epmoe::test
