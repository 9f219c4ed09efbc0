#include "util/error.h"

namespace epmoe {

void fail_assert(const char* expr, const char* file, int line, const std::string& msg) {
  throw Error(std::string("internal error at ") + file + ":" + std::to_string(line) + ": " + msg +
              " (failed: " + expr + ")");
}

}  // namespace epmoe
