// Encoding throughput of the tokenizer on a few MB of generated text.
//
//   tokenizer_bench TOKENIZER_DIR [TEXT_FILE]
//
// TOKENIZER_DIR holds tokenizer.json (or vocab.json + merges.txt + tokenizer_config.json), e.g.
// tests/data/tokenizers/qwen2. Without TEXT_FILE the text is generated deterministically: prose
// built from common words (Zipf-like reuse, so the word cache behaves as on real text), source
// code, numbers, and CJK / Cyrillic runs (long words, many merges, few cache hits).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

class Rng {  // tiny LCG: the generated text must be identical on every run and platform
 public:
  uint32_t next() { return state_ = state_ * 1664525u + 1013904223u; }
  size_t below(size_t n) { return (next() >> 8) % n; }

 private:
  uint32_t state_ = 12345;
};

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
  }
  s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}

std::string prose(Rng& rng, size_t bytes) {
  static const char* const kWords[] = {
      "the",       "of",          "and",        "to",        "in",        "a",          "is",
      "that",      "for",         "it",         "as",        "was",       "with",       "be",
      "by",        "on",          "not",        "he",        "this",      "are",        "or",
      "his",       "from",        "at",         "which",     "but",       "have",       "an",
      "had",       "they",        "you",        "were",      "their",     "one",        "all",
      "we",        "can",         "her",        "has",       "there",     "been",       "if",
      "more",      "when",        "will",       "would",     "who",       "so",         "no",
      "model",     "expert",      "experts",    "routing",   "token",     "tokens",     "layer",
      "attention", "parallelism", "inference",  "memory",    "bandwidth", "throughput", "latency",
      "gradient",  "Mixture",     "capacity",   "balancing", "auxiliary", "loss",       "shared",
      "sparse",    "dense",       "activation", "don't",     "it's",      "we've",      "they'll",
      "I'm",       "Qwen3",       "GPU",        "H200",      "NCCL",      "all-to-all"};
  std::string s;
  while (s.size() < bytes) {
    const size_t words = 5 + rng.below(20);
    for (size_t i = 0; i < words; ++i) {
      // Squaring a uniform index favours the first (most common) words, roughly like Zipf.
      const size_t r = rng.below(std::size(kWords));
      std::string w = kWords[r * r / std::size(kWords)];
      if (i == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
      s += w;
      if (rng.below(12) == 0) s += std::to_string(rng.below(100000));
      s += i + 1 == words ? ". " : (rng.below(10) == 0 ? ", " : " ");
    }
    if (rng.below(6) == 0) s += "\n\n";
  }
  return s;
}

std::string code(Rng& rng, size_t bytes) {
  static const char* const kLines[] = {
      "    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:\n",
      "        router_logits = self.gate(hidden_states)  # (batch * seq, n_experts)\n",
      "        topk_weight, topk_idx = torch.topk(router_logits, self.top_k, dim=-1)\n",
      "for (int64_t i = 0; i < n; ++i) out[i] = std::max(0.0f, in[i] * scale[i]);\n",
      "    if (rank == 0) { printf(\"step %d: loss=%.4f\\n\", step, loss); }\n",
      "        return {\"ids\": [1, 2, 3], \"mask\": None, 'cfg': cfg.to_dict()}\n",
      "\tconst auto& w = weights.at(\"model.layers.\" + std::to_string(l) + \".mlp.gate\");\n"};
  std::string s;
  while (s.size() < bytes) s += kLines[rng.below(std::size(kLines))];
  return s;
}

std::string scripts(Rng& rng, size_t bytes) {
  std::string s;
  while (s.size() < bytes) {
    const size_t n = 2 + rng.below(30);
    const bool cjk = rng.below(3) != 0;
    // Common CJK ideographs sit early in the block; Cyrillic letters at U+0430..U+044F.
    for (size_t i = 0; i < n; ++i)
      s += cjk ? utf8_of(0x4E00 + static_cast<uint32_t>(rng.below(3000)))
               : utf8_of(0x430 + static_cast<uint32_t>(rng.below(32)));
    s += cjk ? "\u3002" : (rng.below(2) ? " " : ". ");  // 。 ends a CJK sentence
  }
  return s;
}

// Splits text into paragraphs of ~2 KB (encode() calls of realistic size).
std::vector<std::string> chunks(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    size_t end = std::min(text.size(), i + 2048);
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
    out.push_back(text.substr(i, end - i));
    i = end;
  }
  return out;
}

struct Result {
  double mb_per_s;
  size_t tokens;
};

Result encode_all(const epmoe::Tokenizer& tok, const std::vector<std::string>& parts) {
  size_t bytes = 0, tokens = 0;
  const auto t0 = Clock::now();
  for (const std::string& p : parts) {
    tokens += tok.encode(p).size();
    bytes += p.size();
  }
  return {bytes / 1e6 / seconds_since(t0), tokens};
}

void report(const char* name, const epmoe::Tokenizer& tok, const std::string& text) {
  const auto parts = chunks(text);
  const Result cold = encode_all(tok, parts);  // first pass fills the word cache
  const Result warm = encode_all(tok, parts);
  std::printf("%-8s %6.2f MB  %9zu tokens  encode %6.2f MB/s (first pass %6.2f MB/s)\n", name,
              text.size() / 1e6, warm.tokens, warm.mb_per_s, cold.mb_per_s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(
        stderr,
        "usage: %s TOKENIZER_DIR [TEXT_FILE]\n"
        "  TOKENIZER_DIR: a folder with tokenizer.json (e.g. tests/data/tokenizers/qwen2)\n"
        "  TEXT_FILE: text to encode (default: ~4 MB of generated mixed text)\n",
        argv[0]);
    return 2;
  }
  try {
    auto t0 = Clock::now();
    const epmoe::Tokenizer tok = epmoe::Tokenizer::load(argv[1]);
    std::printf("load     %.3f s (vocab %d)\n", seconds_since(t0), tok.vocab_size());

    if (argc == 3) {
      std::ifstream f(argv[2], std::ios::binary);
      if (!f) throw epmoe::InputError(std::string(argv[2]) + ": cannot open file");
      std::stringstream ss;
      ss << f.rdbuf();
      report("file", tok, ss.str());
      return 0;
    }
    Rng rng;
    const std::string p = prose(rng, 2'000'000), c = code(rng, 1'000'000),
                      s = scripts(rng, 1'000'000);
    report("prose", tok, p);
    report("code", tok, c);
    report("cjk/cyr", tok, s);
    // Interleave the three kinds at paragraph granularity for the headline figure.
    const auto pp = chunks(p), cc = chunks(c), ss = chunks(s);
    std::string mixed;
    for (size_t i = 0; i < pp.size() || i < cc.size() || i < ss.size(); ++i) {
      if (i < pp.size()) mixed += pp[i];
      if (i < cc.size()) mixed += cc[i];
      if (i < ss.size()) mixed += ss[i];
    }
    report("mixed", tok, mixed);

    const std::vector<int32_t> ids = tok.encode(mixed);
    t0 = Clock::now();
    const std::string back = tok.decode(ids);
    std::printf("decode   %6.2f MB/s (round trip %s)\n", back.size() / 1e6 / seconds_since(t0),
                back == mixed ? "exact" : "DIFFERS");
  } catch (const epmoe::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.exit_code();
  }
  return 0;
}
