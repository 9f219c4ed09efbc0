// Text <-> token ids for byte-level BPE models (Qwen2 / Qwen2.5 / Qwen3 vocabularies and other
// tokenizer.json files of that family), reproducing Hugging Face tokenizers / transformers.
//
//   Tokenizer tok = Tokenizer::load(model_dir);
//   std::vector<int32_t> ids = tok.encode(tok.chat_prompt("Hi"));
//   StreamDecoder out(tok);  for (id : generated) std::cout << out.push(id);  out.flush();
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace epmoe {

class Tokenizer {
 public:
  // Loads model_dir/tokenizer.json or, failing that, model_dir/vocab.json + merges.txt +
  // tokenizer_config.json. InputError (naming the folder or the file at fault) when neither
  // set is there, a file is malformed, or it describes something we do not implement.
  static Tokenizer load(const std::string& model_dir);
  // Whether load() would find tokenizer files in model_dir (it may still reject them).
  static bool available(const std::string& model_dir);

  // The two layouts, from explicit paths.
  static Tokenizer from_tokenizer_json(const std::string& path);
  static Tokenizer from_vocab_merges(const std::string& vocab_json, const std::string& merges_txt,
                                     const std::string& tokenizer_config_json);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text`, as transformers' tokenizer(text)["input_ids"]: added and special tokens
  // written in the text (e.g. "<|im_start|>") become their ids. Ill-formed UTF-8 input is first
  // repaired like Python's bytes.decode(errors="replace"). Safe to call from several threads.
  std::vector<int32_t> encode(std::string_view text) const;

  // Text of `ids`: token bytes concatenated, ill-formed UTF-8 replaced by U+FFFD (maximal
  // subparts, as errors="replace"). Ids outside the vocabulary are skipped, as tokenizers does.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // The ChatML prompt of Qwen models: an optional system turn, the user turn, and the opening
  // of the assistant turn. Pass the result to encode().
  std::string chat_prompt(const std::string& user, const std::string& system = "") const;

  // One more than the largest id (model vocabulary and added tokens together).
  int vocab_size() const;
  // Id of a token spelled as in the vocabulary (byte-level alphabet, e.g. "Ġthe") or of an
  // added token by its content (e.g. "<|im_end|>").
  std::optional<int32_t> token_id(std::string_view token) const;
  // The raw bytes token `id` stands for; empty for ids outside the vocabulary.
  std::string_view token_bytes(int32_t id) const;
  // Whether `id` is an added token marked special (skipped by decode(ids, true)).
  bool is_special(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns generated ids into text as they arrive. A character split across tokens (CJK, emoji)
// is held back until it is complete, so every piece returned is well-formed UTF-8 and the
// pieces together equal decode() of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}

  // Text that is complete after `id` (often empty while a character is unfinished).
  std::string push(int32_t id);
  // The held-back rest; an unfinished character becomes U+FFFD. The decoder can then be reused.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes not yet returned
};

}  // namespace epmoe
