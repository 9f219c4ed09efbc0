// util/env: the one table of environment variables. A name missing from it is refused (so the
// table, and the docs the layering test checks against it, cannot miss a variable); the readers
// give the values the knobs document.
#include "util/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "util/error.h"

namespace epmoe {
namespace {

TEST(Env, NameOutsideTheTableIsRefused) {
  EXPECT_THROW(env_get("EPMOE_NOT_A_KNOB"), Error);
  EXPECT_THROW(env_off("HOME"), Error);
}

TEST(Env, ReadersGiveTheValues) {
  ::unsetenv("EPMOE_ATTN_DECODE");
  EXPECT_EQ(env_get("EPMOE_ATTN_DECODE"), nullptr);
  EXPECT_EQ(env_int("EPMOE_ATTN_DECODE", 32), 32);
  ::setenv("EPMOE_ATTN_DECODE", "7", 1);
  EXPECT_EQ(env_int("EPMOE_ATTN_DECODE", 32), 7);
  ::setenv("EPMOE_ATTN_DECODE", "", 1);  // empty reads as unset
  EXPECT_EQ(env_get("EPMOE_ATTN_DECODE"), nullptr);
  ::unsetenv("EPMOE_ATTN_DECODE");

  ::unsetenv("EPMOE_PDL");
  EXPECT_FALSE(env_off("EPMOE_PDL"));
  ::setenv("EPMOE_PDL", "0", 1);
  EXPECT_TRUE(env_off("EPMOE_PDL"));
  ::setenv("EPMOE_PDL", "1", 1);
  EXPECT_FALSE(env_off("EPMOE_PDL"));
  ::unsetenv("EPMOE_PDL");
}

TEST(Env, TableNamesAreUniqueAndDescribed) {
  std::set<std::string> names;
  for (const EnvVar& v : env_table()) {
    EXPECT_TRUE(names.insert(v.name).second) << v.name << " twice";
    EXPECT_GT(std::strlen(v.values), 0u) << v.name;
    EXPECT_GT(std::strlen(v.what), 10u) << v.name;
  }
  EXPECT_GE(names.size(), 10u);
}

}  // namespace
}  // namespace epmoe
