// Token id lists as users type them: "1,2,3" <-> ids (flags, prompt files, file metadata).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epmoe {

// "1,2,3" -> ids; throws InputError naming `what` (the flag or file:line) on bad syntax.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& what);
std::string join_ids(const std::vector<int32_t>& ids);

}  // namespace epmoe
