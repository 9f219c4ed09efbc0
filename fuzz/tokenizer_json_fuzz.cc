// Fuzzes the tokenizer.json reader (Tokenizer::from_tokenizer_json) on arbitrary files: the only
// exception allowed out is InputError, and a tokenizer it accepts must encode and decode text
// into ids of its own vocabulary (no crash, no runaway allocation from a huge id).
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace epmoe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_input_file(data, size, "-tokenizer.json");
  try {
    Tokenizer tok = Tokenizer::from_tokenizer_json(path);
    for (const char* text : {"Hello, world!", "  spaces\tand\nlines\r\n", "<|im_start|>user\nhi<|im_end|>",
                             "\xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80", "don't 123456 ...", ""}) {
      const std::vector<int32_t> ids = tok.encode(text);
      for (int32_t id : ids) FUZZ_REQUIRE(id >= 0 && id < tok.vocab_size(), "ids are in the vocabulary");
      (void)tok.decode(ids);
    }
  } catch (const InputError&) {
  }
  return 0;
}
