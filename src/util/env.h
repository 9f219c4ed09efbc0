// Every environment variable epmoe reads, in one table: the knobs that switch a kernel path off to
// measure it against another (their defaults are what every figure and test in docs/ uses), the
// variables of the multi-process launchers, and the test-only fault hook. Flags and options
// structs carry everything a user chooses; these exist for benchmarks, launchers and tests.
//
// A read goes through env_get(), which refuses (asserts) a name missing from the table, so the
// table is complete by construction; docs/ARCHITECTURE.md ("Environment variables") lists it, and
// tests/layering_test.sh checks that no other file calls getenv and that the docs name every
// entry.
#pragma once

#include <string>
#include <vector>

namespace epmoe {

struct EnvVar {
  const char* name;
  const char* values;  // what it takes, default first
  const char* what;    // what it changes, and why it exists
};

const std::vector<EnvVar>& env_table();

// The variable's value, or nullptr when unset (or empty).
const char* env_get(const char* name);
// Set to "0": a path that is on by default turned off.
bool env_off(const char* name);
// Set to "1": a path that is off by default turned on.
bool env_on(const char* name);
// An integer, or `dflt` when unset.
long long env_int(const char* name, long long dflt);

}  // namespace epmoe
