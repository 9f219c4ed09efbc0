// Fuzzes Tokenizer::encode with the real Qwen2 vocabulary (tests/data/tokenizers/qwen2, loaded
// once) on arbitrary bytes, and checks what encode/decode promise:
//   - every id is a token of the vocabulary;
//   - text that is well-formed UTF-8 and already NFC comes back unchanged from decode(encode());
//   - a StreamDecoder fed the ids one by one yields, in well-formed pieces, exactly decode().
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

using namespace epmoe;

namespace {
const Tokenizer* g_tok = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Loading takes about a second (150k tokens); once per process, not per input.
  static Tokenizer tok = Tokenizer::from_tokenizer_json(std::string(EPMOE_TEST_DATA) + "/tokenizers/qwen2/tokenizer.json");
  g_tok = &tok;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& tok = *g_tok;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = tok.encode(text);
  for (int32_t id : ids)
    FUZZ_REQUIRE(id >= 0 && id < tok.vocab_size() && !tok.token_bytes(id).empty(), "ids are tokens");
  const std::string decoded = tok.decode(ids);
  if (utf8::is_valid(text) && utf8::nfc(text) == text)
    FUZZ_REQUIRE(decoded == text, "decode(encode(text)) == text for NFC text");
  StreamDecoder stream(tok);
  std::string pieces;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    FUZZ_REQUIRE(utf8::is_valid(piece), "streamed pieces are well-formed UTF-8");
    pieces += piece;
  }
  pieces += stream.flush();
  FUZZ_REQUIRE(pieces == decoded, "streamed pieces add up to decode()");
  return 0;
}
