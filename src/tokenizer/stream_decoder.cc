// StreamDecoder (declared in tokenizer.h): incremental decoding for printing generated tokens.
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace epmoe {

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  pending_ += tokenizer_->token_bytes(id);
  // Everything up to an unfinished trailing character is final: replacement decisions before a
  // lead byte never depend on the bytes after it.
  const size_t ready = pending_.size() - utf8::incomplete_tail(pending_);
  std::string out = utf8::lossy(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace epmoe
