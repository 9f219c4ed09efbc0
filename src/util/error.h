// Errors with context. Two kinds matter to the user because they map to exit codes:
//   InputError  -> exit 2: the user gave us something malformed (file, config, flag, ids).
//   CheckError  -> exit 1: a check we run failed (golden mismatch, audit verdict, peer failure).
// Every message should name the thing at fault: the file, the tensor or field, the rank.
#pragma once

#include <stdexcept>
#include <string>

namespace epmoe {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  virtual int exit_code() const { return 1; }
};

class InputError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return 2; }
};

class CheckError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return 1; }
};

// Internal invariant violated: a bug in epmoe, reported with the place it was detected.
[[noreturn]] void fail_assert(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace epmoe

// EPMOE_ASSERT(cond, message-expression): throws epmoe::Error naming file:line and the message.
#define EPMOE_ASSERT(cond, msg)                                              \
  do {                                                                       \
    if (!(cond)) ::epmoe::fail_assert(#cond, __FILE__, __LINE__, (msg));     \
  } while (0)
