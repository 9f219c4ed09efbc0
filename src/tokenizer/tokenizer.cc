#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <deque>
#include <filesystem>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer_files.h"
#include "tokenizer/utf8.h"
#include "tokenizer/word_cache.h"
#include "util/error.h"

namespace epmoe {

struct Tokenizer::Impl {
  Bpe bpe;
  bool nfc = false;
  PreTokenizer pre_tokenizer;
  std::vector<AddedToken> added;   // never resized after construction: the matchers point here
  AddedTokenMatcher raw_matcher;   // tokens matched in the text as given
  AddedTokenMatcher norm_matcher;  // tokens matched after normalisation
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> added_ids;
  std::vector<std::string> id_bytes;  // decode table: raw bytes of every id
  std::vector<uint8_t> id_flags;      // kKnown | kSpecial
  mutable WordCache cache;

  static constexpr uint8_t kKnown = 1, kSpecial = 2;

  explicit Impl(TokenizerSpec spec);
  void encode_normalized(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_words(std::string_view text, std::vector<int32_t>& ids) const;
};

Tokenizer::Impl::Impl(TokenizerSpec spec)
    : bpe(std::move(spec.vocab), spec.merges, spec.ignore_merges, spec.source),
      nfc(spec.nfc),
      pre_tokenizer(std::move(spec.pre_tokenizer)),
      added(std::move(spec.added_tokens)) {
  assign_added_token_ids(added, bpe.vocab());
  int32_t max_id = -1;
  const std::string* max_token = nullptr;
  for (const auto& [spelling, id] : bpe.vocab())
    if (id > max_id) max_id = id, max_token = &spelling;
  for (const AddedToken& t : added)
    if (t.id > max_id) max_id = t.id, max_token = &t.content;
  // The decode table below has a slot for every id up to the largest. Ids are dense in real
  // tokenizers (gaps of a few reserved ids at most); one stray huge id would make the table
  // gigabytes and end in bad_alloc, so it is refused by name.
  const size_t tokens = bpe.vocab().size() + added.size();
  if (max_id >= 0 && static_cast<size_t>(max_id) >= 2 * tokens + 1024)
    throw InputError(spec.source + ": token '" + *max_token + "' has id " + std::to_string(max_id) +
                     ", far beyond the " + std::to_string(tokens) +
                     " tokens of the vocabulary (ids must be dense)");
  id_bytes.resize(static_cast<size_t>(max_id) + 1);
  id_flags.assign(id_bytes.size(), 0);

  // tokenizers' ByteLevel decoder maps each token's characters back to bytes; a token with a
  // character outside the byte alphabet (an added token like "<思考>") is taken as its UTF-8.
  auto bytes_of = [](const std::string& spelling) {
    std::optional<std::string> b = byte_level::decode(spelling);
    return b ? std::move(*b) : spelling;
  };
  for (const auto& [spelling, id] : bpe.vocab()) {
    id_bytes[id] = bytes_of(spelling);
    id_flags[id] = kKnown;
  }
  for (const AddedToken& t : added) {
    id_bytes[t.id] = bytes_of(t.content);
    id_flags[t.id] = kKnown | (t.special ? kSpecial : 0);
    added_ids[t.content] = t.id;
    if (t.normalized) {
      norm_matcher.add(&t, nfc ? utf8::nfc(t.content) : t.content);
    } else {
      raw_matcher.add(&t, t.content);
    }
  }
}

// Pre-tokenizes already-normalised text into words and encodes each, through the cache.
void Tokenizer::Impl::encode_words(std::string_view text, std::vector<int32_t>& ids) const {
  thread_local std::vector<std::string_view> words;
  std::deque<std::string> storage;
  words.clear();
  pre_tokenizer.split(text, words, storage);
  for (std::string_view w : words) {
    if (cache.lookup(w, ids)) continue;
    const size_t before = ids.size();
    bpe.encode_word(w, ids);
    cache.insert(w, ids.data() + before, ids.size() - before);
  }
}

// One stretch of text between raw added tokens: normalise, cut out normalised added tokens,
// encode the rest.
void Tokenizer::Impl::encode_normalized(std::string_view text, std::vector<int32_t>& ids) const {
  std::string normalized;
  if (nfc) {
    normalized = utf8::nfc(text);
    text = normalized;
  }
  if (norm_matcher.empty()) {
    encode_words(text, ids);
    return;
  }
  std::vector<AddedTokenMatcher::Piece> pieces;
  norm_matcher.split(text, pieces);
  for (const auto& p : pieces) {
    if (p.id >= 0) {
      ids.push_back(p.id);
    } else {
      encode_words(text.substr(p.begin, p.end - p.begin), ids);
    }
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_tokenizer_json(const std::string& path) {
  return Tokenizer(std::make_unique<Impl>(read_tokenizer_json(path)));
}

Tokenizer Tokenizer::from_vocab_merges(const std::string& vocab_json, const std::string& merges_txt,
                                       const std::string& tokenizer_config_json) {
  return Tokenizer(
      std::make_unique<Impl>(read_vocab_merges(vocab_json, merges_txt, tokenizer_config_json)));
}

namespace {
namespace fs = std::filesystem;

bool has_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool has_vocab_merges(const fs::path& dir) {
  return has_file(dir / "vocab.json") && has_file(dir / "merges.txt") &&
         has_file(dir / "tokenizer_config.json");
}

}  // namespace

bool Tokenizer::available(const std::string& model_dir) {
  return has_file(fs::path(model_dir) / "tokenizer.json") || has_vocab_merges(model_dir);
}

Tokenizer Tokenizer::load(const std::string& model_dir) {
  const fs::path dir(model_dir);
  if (has_file(dir / "tokenizer.json"))
    return from_tokenizer_json((dir / "tokenizer.json").string());
  if (has_vocab_merges(dir)) {
    return from_vocab_merges((dir / "vocab.json").string(), (dir / "merges.txt").string(),
                             (dir / "tokenizer_config.json").string());
  }
  throw InputError(model_dir +
                   ": no tokenizer files (need tokenizer.json, or vocab.json + merges.txt + "
                   "tokenizer_config.json)");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::lossy(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (impl_->raw_matcher.empty()) {
    impl_->encode_normalized(text, ids);
    return ids;
  }
  std::vector<AddedTokenMatcher::Piece> pieces;
  impl_->raw_matcher.split(text, pieces);
  for (const auto& p : pieces) {
    if (p.id >= 0) {
      ids.push_back(p.id);
    } else {
      impl_->encode_normalized(text.substr(p.begin, p.end - p.begin), ids);
    }
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  return utf8::lossy(bytes);
}

std::string Tokenizer::chat_prompt(const std::string& user, const std::string& system) const {
  std::string p;
  if (!system.empty()) p += "<|im_start|>system\n" + system + "<|im_end|>\n";
  p += "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
  return p;
}

int Tokenizer::vocab_size() const { return static_cast<int>(impl_->id_bytes.size()); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (auto it = impl_->bpe.vocab().find(token); it != impl_->bpe.vocab().end()) return it->second;
  return std::nullopt;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_bytes.size()) return {};
  return impl_->id_bytes[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_flags.size() &&
         (impl_->id_flags[static_cast<size_t>(id)] & Impl::kSpecial);
}

}  // namespace epmoe
