// Every row of docs/hostile-inputs.md, run through the real `epmoe` command: a copy of a fixture
// with one thing broken must give exit code 2 and one line that names the file, the tensor or
// field, and what is wrong. The last tests check that the table in the docs and these rows are
// the same list, so neither can drift from the other.
#include <gtest/gtest.h>

#include <functional>
#include <regex>
#include <set>

#include "common/run.h"
#include "common/safetensors_edit.h"
#include "common/scratch.h"
#include "io/safetensors.h"

namespace epmoe {
namespace {

using nlohmann::json;
using test::RawSafetensors;
using test::Scratch;

// What a row runs and what its one-line message must contain.
struct Expect {
  std::string args;                    // after `epmoe`
  std::vector<std::string> fragments;  // the file, the tensor or field, the problem
};

struct Row {
  std::string id;       // test name, and the row's key in docs/hostile-inputs.md
  std::string fixture;  // copied into the scratch folder before `apply`
  std::function<Expect(const Scratch&)> apply;  // breaks one thing
};
void PrintTo(const Row& r, std::ostream* os) { *os << r.id; }  // gtest names a failing row by its id

std::string generate(const Scratch& s, const std::string& ids = "1,2,3") {
  return "generate --model " + s.dir() + " --prompt-ids " + ids + " --max-new-tokens 2";
}

// ---- safetensors (qwen3moe-tiny/model.safetensors) ----
const char* kNorm = "model.norm.weight";  // F32 [64]: 256 bytes

Expect break_safetensors(const Scratch& s, const std::function<void(RawSafetensors&, std::string& text, int64_t& len)>& f,
                         std::vector<std::string> fragments) {
  const std::string file = s.path("model.safetensors");
  RawSafetensors st = RawSafetensors::read(file);
  std::string text;
  int64_t len = -1;
  f(st, text, len);
  st.write(file, text, len);
  fragments.insert(fragments.begin(), file);
  return {generate(s), fragments};
}

std::vector<Row> safetensors_rows() {
  const std::string fx = "qwen3moe-tiny";
  return {
      {"safetensors_truncated", fx,
       [](const Scratch& s) {
         return break_safetensors(
             s, [](RawSafetensors& st, std::string&, int64_t&) { st.data.resize(st.data.size() / 2); },
             {"beyond the data section", "truncated"});
       }},
      {"safetensors_shorter_than_length_prefix", fx,
       [](const Scratch& s) {
         test::write_file(s.path("model.safetensors"), "abc");
         return Expect{generate(s), {s.path("model.safetensors"), "shorter than the 8-byte header length"}};
       }},
      {"safetensors_header_length_beyond_file", fx,
       [](const Scratch& s) {
         return break_safetensors(
             s, [](RawSafetensors& st, std::string&, int64_t& len) { len = int64_t(st.data.size()) * 2; },
             {"header length", "runs past the end of the file"});
       }},
      {"safetensors_header_length_above_100MB", fx,
       [](const Scratch& s) {
         return break_safetensors(
             s, [](RawSafetensors&, std::string&, int64_t& len) { len = int64_t(200) << 20; },
             {"header length 209715200", "exceeds the 100 MB limit"});
       }},
      {"safetensors_header_not_json", fx,
       [](const Scratch& s) {
         return break_safetensors(
             s, [](RawSafetensors& st, std::string& text, int64_t&) { text = st.header.dump().substr(0, 100); },
             {"header is not valid JSON"});
       }},
      {"safetensors_header_not_object", fx,
       [](const Scratch& s) {
         return break_safetensors(s, [](RawSafetensors&, std::string& text, int64_t&) { text = "[1, 2, 3]"; },
                                  {"header JSON is not an object"});
       }},
      {"safetensors_unknown_dtype", fx,
       [](const Scratch& s) {
         return break_safetensors(
             s, [](RawSafetensors& st, std::string&, int64_t&) { st.entry(kNorm)["dtype"] = "F7"; },
             {"tensor 'model.norm.weight'", "unknown dtype 'F7'"});
       }},
      {"safetensors_shape_size_mismatch", fx,
       [](const Scratch& s) {
         return break_safetensors(
             s, [](RawSafetensors& st, std::string&, int64_t&) { st.entry(kNorm)["shape"] = {65}; },
             {"tensor 'model.norm.weight'", "shape x dtype size is 260 bytes but data_offsets span 256"});
       }},
      {"safetensors_offsets_overlap", fx,
       [](const Scratch& s) {
         return break_safetensors(
             s,
             [](RawSafetensors& st, std::string&, int64_t&) {
               // Same size, so only the overlap is wrong.
               st.entry("model.layers.0.self_attn.k_norm.weight")["data_offsets"] =
                   st.entry("model.layers.0.self_attn.q_norm.weight")["data_offsets"];
             },
             {"model.layers.0.self_attn.k_norm.weight", "model.layers.0.self_attn.q_norm.weight", "overlap"});
       }},
      {"safetensors_offsets_out_of_order", fx,
       [](const Scratch& s) {
         return break_safetensors(
             s,
             [](RawSafetensors& st, std::string&, int64_t&) {
               json& o = st.entry(kNorm)["data_offsets"];
               o = {o[1], o[0]};
             },
             {"tensor 'model.norm.weight'", "data_offsets end", "before begin"});
       }},
      {"safetensors_offsets_beyond_data", fx,
       [](const Scratch& s) {
         return break_safetensors(
             s,
             [](RawSafetensors& st, std::string&, int64_t&) {
               st.entry(kNorm)["data_offsets"] = {st.data.size(), st.data.size() + 256};
             },
             {"tensor 'model.norm.weight'", "beyond the data section"});
       }},
      {"safetensors_duplicate_name", fx,
       [](const Scratch& s) {
         return break_safetensors(
             s,
             [](RawSafetensors& st, std::string& text, int64_t&) {
               // nlohmann cannot hold a duplicate key, so the header is written as text.
               text = "{\"model.norm.weight\":" + st.entry(kNorm).dump() + "," + st.header.dump().substr(1);
             },
             {"tensor 'model.norm.weight' is listed twice"});
       }},
  };
}

// ---- model.safetensors.index.json (qwen3moe-tiny-mixed-bf16: two shards) ----
const char* kIndex = "model.safetensors.index.json";
const char* kShard1 = "model-00001-of-00002.safetensors";
const char* kShard2 = "model-00002-of-00002.safetensors";

std::string first_tensor_in(const Scratch& s, const std::string& shard) {
  const json index = s.json(kIndex);
  for (auto& [name, file] : index["weight_map"].items())
    if (file == shard) return name;
  throw std::runtime_error("no tensor in " + shard);
}

std::vector<Row> index_rows() {
  const std::string fx = "qwen3moe-tiny-mixed-bf16";
  return {
      {"index_missing_shard", fx,
       [](const Scratch& s) {
         s.remove(kShard2);
         return Expect{generate(s), {s.path(kIndex), std::string("shard '") + kShard2 + "'", "is missing"}};
       }},
      {"index_tensor_listed_twice", fx,
       [](const Scratch& s) {
         json index = s.json(kIndex);
         const std::string name = first_tensor_in(s, kShard1);
         s.set_text(kIndex, "{\"weight_map\": {\"" + name + "\": \"" + kShard1 + "\", " +
                                index["weight_map"].dump().substr(1) + "}");
         return Expect{generate(s), {s.path(kIndex), "tensor '" + name + "' is listed twice in weight_map"}};
       }},
      {"index_shard_lacks_listed_tensor", fx,
       [](const Scratch& s) {
         json index = s.json(kIndex);
         const std::string name = first_tensor_in(s, kShard2);
         index["weight_map"][name] = kShard1;  // it lives in shard 2
         s.set_json(kIndex, index);
         return Expect{generate(s), {s.path(kShard1), "lacks tensor '" + name + "'", s.path(kIndex)}};
       }},
      {"index_not_json", fx,
       [](const Scratch& s) {
         s.set_text(kIndex, s.text(kIndex).substr(0, 200));
         return Expect{generate(s), {s.path(kIndex), "invalid JSON"}};
       }},
  };
}

// ---- config.json (qwen3moe-tiny) ----
Row config_row(const std::string& id, const std::function<void(json&)>& edit, std::vector<std::string> fragments) {
  return {id, "qwen3moe-tiny", [edit, fragments](const Scratch& s) {
            json c = s.json("config.json");
            edit(c);
            s.set_json("config.json", c);
            std::vector<std::string> f = fragments;
            f.insert(f.begin(), s.path("config.json"));
            return Expect{generate(s), f};
          }};
}

std::vector<Row> config_rows() {
  return {
      config_row("config_missing_field", [](json& c) { c.erase("hidden_size"); }, {"field 'hidden_size' is missing"}),
      config_row("config_wrong_type", [](json& c) { c["num_hidden_layers"] = "3"; },
                 {"field 'num_hidden_layers' must be an integer, got \"3\""}),
      config_row("config_heads_not_dividing", [](json& c) { c["num_key_value_heads"] = 3; },
                 {"field 'num_key_value_heads' (3) must divide num_attention_heads (4)"}),
      config_row("config_hidden_not_dividing_heads",
                 [](json& c) {
                   c.erase("head_dim");
                   c["num_attention_heads"] = 6;
                   c["num_key_value_heads"] = 2;
                 },
                 {"field 'num_attention_heads' (6) must divide hidden_size (64)"}),
      config_row("config_unknown_model_type", [](json& c) { c["model_type"] = "llama"; },
                 {"field 'model_type' is 'llama'", "supported: qwen3_moe"}),
      config_row("config_top_k_above_experts", [](json& c) { c["num_experts_per_tok"] = 9; },
                 {"field 'num_experts_per_tok' (9) exceeds the number of experts (8)"}),
      config_row("config_unknown_rope_type", [](json& c) { c["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}}; },
                 {"field 'rope_scaling' has rope type 'longrope'", "supported: default, yarn"}),
      config_row("config_partial_rotary_out_of_range",
                 [](json& c) { c["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 5.5}}; },
                 {"field 'rope_parameters.partial_rotary_factor' must be in (0, 1]"}),
      {"config_not_json", "qwen3moe-tiny",
       [](const Scratch& s) {
         s.set_text("config.json", "{\"model_type\": \"qwen3_moe\",");
         return Expect{generate(s), {s.path("config.json"), "invalid JSON"}};
       }},
      // The config parses but describes another model than the weights: named by tensor.
      config_row("config_disagrees_with_weights", [](json& c) { c["hidden_size"] = 32; },
                 {"tensor 'model.embed_tokens.weight' has shape [320, 64], expected [320, 32]"}),
  };
}

// ---- latent attention and FP8 checkpoints (deepseek-v2-lite-tiny, qwen3moe-fp8-tiny) ----
Row fixture_config_row(const std::string& id, const std::string& fixture, const std::function<void(json&)>& edit,
                       std::vector<std::string> fragments) {
  Row r = config_row(id, edit, std::move(fragments));
  r.fixture = fixture;
  return r;
}

// Renames or reshapes one header entry of qwen3moe-fp8-tiny/model.safetensors.
Expect break_fp8_header(const Scratch& s, const std::function<void(json&)>& f, std::vector<std::string> fragments) {
  const std::string file = s.path("model.safetensors");
  RawSafetensors st = RawSafetensors::read(file);
  f(st.header);
  st.write(file);
  return {generate(s), fragments};
}

const char* kFp8Weight = "model.layers.0.self_attn.q_proj.weight";  // F8_E4M3 [128, 192]: scale grid [1, 2]

std::vector<Row> mla_fp8_rows() {
  return {
      fixture_config_row("mla_head_dim_disagrees", "deepseek-v2-lite-tiny", [](json& c) { c["head_dim"] = 20; },
                         {"field 'head_dim' (20) disagrees with qk_nope_head_dim + qk_rope_head_dim (24)"}),
      fixture_config_row("mla_dims_disagree_with_weights", "deepseek-v2-lite-tiny", [](json& c) { c["v_head_dim"] = 20; },
                         {"tensor 'model.layers.0.self_attn.kv_b_proj.weight' has shape [112, 32], expected [144, 32]"}),
      fixture_config_row("quantization_method_unsupported", "qwen3moe-fp8-tiny",
                         [](json& c) { c["quantization_config"]["quant_method"] = "awq"; },
                         {"field 'quantization_config.quant_method' is 'awq'", "only fp8"}),
      fixture_config_row("quantization_block_unsupported", "qwen3moe-fp8-tiny",
                         [](json& c) { c["quantization_config"]["weight_block_size"] = {64, 64}; },
                         {"field 'quantization_config.weight_block_size' is [64,64]", "only [128, 128] blocks"}),
      {"fp8_scale_wrong_grid", "qwen3moe-fp8-tiny",
       [](const Scratch& s) {
         return break_fp8_header(s, [](json& h) { h[std::string(kFp8Weight) + "_scale_inv"]["shape"] = {2, 1}; },
                                 {"tensor 'model.layers.0.self_attn.q_proj.weight_scale_inv' has shape [2, 1]",
                                  "expected the [1, 2] grid of 128x128 blocks of 'model.layers.0.self_attn.q_proj.weight'"});
       }},
      {"fp8_weight_without_scale", "qwen3moe-fp8-tiny",
       [](const Scratch& s) {
         return break_fp8_header(s,
                                 [](json& h) {
                                   const std::string k = std::string(kFp8Weight) + "_scale_inv";
                                   h[k + "_renamed"] = h[k];
                                   h.erase(k);
                                 },
                                 {"tensor 'model.layers.0.self_attn.q_proj.weight' is F8_E4M3 without its scale "
                                  "'model.layers.0.self_attn.q_proj.weight_scale_inv'"});
       }},
      {"fp8_weight_without_quantization_config", "qwen3moe-fp8-tiny",
       [](const Scratch& s) {
         json c = s.json("config.json");
         c.erase("quantization_config");
         s.set_json("config.json", c);
         return Expect{generate(s), {"tensor 'model.layers.0.self_attn.q_proj.weight' is F8_E4M3 but",
                                     "has no fp8 quantization_config"}};
       }},
  };
}

// ---- tokenizer files (bpe-tokenizer/tokenizer.json) ----
std::string tokenize(const Scratch& s) { return "tokenize --model " + s.dir() + " --text 'Hello world'"; }

std::vector<Row> tokenizer_rows() {
  const std::string fx = "bpe-tokenizer";
  return {
      {"tokenizer_bad_json", fx,
       [](const Scratch& s) {
         s.set_text("tokenizer.json", s.text("tokenizer.json").substr(0, 1000));
         return Expect{tokenize(s), {s.path("tokenizer.json"), "invalid JSON"}};
       }},
      {"tokenizer_merge_unknown_token", fx,
       [](const Scratch& s) {
         json t = s.json("tokenizer.json");
         t["model"]["merges"].push_back({"epmoe-no-such-token", "x"});
         s.set_json("tokenizer.json", t);
         return Expect{tokenize(s), {s.path("tokenizer.json"), "needs token 'epmoe-no-such-token'",
                                     "not in the vocabulary"}};
       }},
      {"tokenizer_number_overflow", fx,
       [](const Scratch& s) {
         std::string t = s.text("tokenizer.json");
         const size_t at = t.find("\"dropout\":");
         if (at == std::string::npos) throw std::runtime_error("no dropout field");
         t.insert(at + 10, " 1e999,\"epmoe-was-dropout\":");  // a number beyond double range
         s.set_text("tokenizer.json", t);
         return Expect{tokenize(s), {s.path("tokenizer.json"), "invalid JSON", "number overflow"}};
       }},
      {"tokenizer_id_far_beyond_vocabulary", fx,
       [](const Scratch& s) {
         json t = s.json("tokenizer.json");
         t["model"]["vocab"]["epmoe-far-away"] = 2147483000;
         s.set_json("tokenizer.json", t);
         return Expect{tokenize(s), {s.path("tokenizer.json"), "'epmoe-far-away'", "2147483000"}};
       }},
  };
}

// ---- command line (qwen3moe-tiny: vocabulary 0..319) ----
std::vector<Row> command_line_rows() {
  const std::string fx = "qwen3moe-tiny";
  return {
      {"ids_outside_vocabulary", fx,
       [](const Scratch& s) {
         return Expect{generate(s, "1,2,999"), {"--prompt-ids", "token id 999 (position 2) is outside the vocabulary 0..319",
                                                s.path("config.json")}};
       }},
      {"ids_negative", fx,
       [](const Scratch& s) {
         return Expect{generate(s, "5,-1"), {"--prompt-ids", "token id -1 (position 1) is outside the vocabulary"}};
       }},
      {"ids_malformed", fx,
       [](const Scratch& s) { return Expect{generate(s, "1,,2"), {"--prompt-ids", "expected comma-separated token ids"}}; }},
      {"empty_prompt_ids", fx,
       [](const Scratch& s) { return Expect{generate(s, "''"), {"--prompt-ids: empty prompt"}}; }},
      {"empty_prompt_text", fx,
       [](const Scratch& s) {
         return Expect{"generate --model " + s.dir() + " --prompt ''", {"--prompt: empty prompt"}};
       }},
      {"empty_prompts_file", fx,
       [](const Scratch& s) {
         s.set_text("prompts.txt", "\n  \n");
         return Expect{"generate --model " + s.dir() + " --prompts-file " + s.path("prompts.txt"),
                       {s.path("prompts.txt"), "no prompts"}};
       }},
      {"prompt_beyond_max_position_embeddings", fx,
       [](const Scratch& s) {
         json c = s.json("config.json");
         c["max_position_embeddings"] = 8;
         s.set_json("config.json", c);
         return Expect{"generate --model " + s.dir() + " --prompt-ids 1,2,3,4,5,6 --max-new-tokens 4",
                       {"--prompt-ids", "6 prompt tokens + 4 new tokens need 9 positions",
                        "more than max_position_embeddings (8)", s.path("config.json")}};
       }},
      {"score_beyond_max_position_embeddings", fx,
       [](const Scratch& s) {
         json c = s.json("config.json");
         c["max_position_embeddings"] = 8;
         s.set_json("config.json", c);
         return Expect{"score --model " + s.dir() + " --ids 1,2,3,4,5,6,7,8,9 --out " + s.path("logits.safetensors"),
                       {"--ids", "9 prompt tokens need 9 positions", "max_position_embeddings (8)"}};
       }},
      {"placement_slot_assigned_twice", fx,
       [](const Scratch& s) {
         s.set_text("placement.json", R"({"0": [0], "1": [1, 0], "2": [2], "3": [3], "4": [4], "5": [5], "6": [6], "7": [7]})");
         return Expect{generate(s) + " --placement " + s.path("placement.json"),
                       {s.path("placement.json"), "physical slot 0 is assigned twice"}};
       }},
      {"redundant_experts_above_experts", fx,
       [](const Scratch& s) {
         return Expect{generate(s) + " --ep-redundant-experts 9", {"--ep-redundant-experts 9", "number of experts (8)"}};
       }},
  };
}

std::vector<Row> all_rows() {
  std::vector<Row> rows;
  for (auto part : {safetensors_rows(), index_rows(), config_rows(), mla_fp8_rows(), tokenizer_rows(), command_line_rows()})
    rows.insert(rows.end(), part.begin(), part.end());
  return rows;
}

std::vector<std::string> lines_of(const std::string& out) {
  std::vector<std::string> lines;
  std::stringstream ss(out);
  std::string l;
  while (std::getline(ss, l))
    if (!l.empty()) lines.push_back(l);
  return lines;
}

class HostileInput : public ::testing::TestWithParam<Row> {};

TEST_P(HostileInput, Refused) {
  const Row& row = GetParam();
  Scratch s(row.fixture);
  const Expect e = row.apply(s);
  const auto r = test::run_command(test::epmoe() + " " + e.args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const auto lines = lines_of(r.output);
  ASSERT_EQ(lines.size(), 1u) << "expected one line, got:\n" << r.output;
  EXPECT_EQ(lines[0].rfind("epmoe: error: ", 0), 0u) << lines[0];
  for (const auto& f : e.fragments) EXPECT_NE(lines[0].find(f), std::string::npos) << "missing '" << f << "' in: " << lines[0];
  std::printf("[hostile] %s -> %s\n", row.id.c_str(), lines[0].c_str());
}

INSTANTIATE_TEST_SUITE_P(Rows, HostileInput, ::testing::ValuesIn(all_rows()),
                         [](const auto& info) { return info.param.id; });

// ---- expert parallelism: more ranks than physical experts ----

// qwen3moe-tiny cut down to its first two experts (top-1): the router keeps its first two rows.
void write_two_expert_model(const Scratch& s) {
  const SafetensorsFile src(test::fixture("qwen3moe-tiny") + "/model.safetensors");
  const std::regex expert(R"(\.experts\.(\d+)\.)"), router(R"(\.mlp\.gate\.weight$)");
  std::vector<TensorToWrite> keep;
  for (const auto& name : src.names()) {
    std::smatch m;
    if (std::regex_search(name, m, expert) && std::stoi(m[1]) >= 2) continue;
    TensorView v = src.get(name);
    if (std::regex_search(name, router)) v = v.slice_rows(0, 2);
    keep.push_back({name, v.dtype, v.shape, v.data});
  }
  write_safetensors(s.path("model.safetensors"), keep);
  json c = s.json("config.json");
  c["num_experts"] = 2;
  c["num_experts_per_tok"] = 1;
  s.set_json("config.json", c);
}

// Allowed, by design: with R ranks and P physical experts rank r owns [P*r/R, P*(r+1)/R), so at
// R = 3, P = 2 rank 0 owns none and still routes its tokens and joins every layer. The output
// must be the single process's, bit for bit (deterministic combine), with every backend.
TEST(HostileInputs, ep_more_ranks_than_physical_experts) {
  Scratch s("qwen3moe-tiny");
  write_two_expert_model(s);
  s.set_text("prompts.txt", "1,2,3,4,5\n100,200,300\n7\n42,43\n");
  const std::string args = " generate --model " + s.dir() + " --prompts-file " + s.path("prompts.txt") +
                           " --max-new-tokens 6 --ignore-eos --comm-timeout 30";
  const auto one = test::run_command(test::epmoe() + args);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(lines_of(one.output).size(), 4u) << one.output;
  for (const char* backend : {"none", "alltoall", "lowlatency", "onesided", "fused"}) {
    const auto three = test::run_command(test::mpirun(3) + test::epmoe() + args + " --moe-a2a-backend " + backend);
    EXPECT_EQ(three.exit_code, 0) << backend << ": " << three.output;
    EXPECT_EQ(three.output, one.output) << backend;
  }
}

// ---- safetensors written without header padding ----

// Old writers did not pad the header, so tensors may start at any byte. Accepted: such tensors
// are copied once to aligned memory (reading a bf16 through an odd address is undefined). The
// output must be the aligned file's.
TEST(HostileInputs, safetensors_misaligned_tensors) {
  Scratch s("qwen3moe-tiny-mixed-bf16");
  for (const char* shard : {kShard1, kShard2}) {
    RawSafetensors st = RawSafetensors::read(s.path(shard));
    std::string h = st.header.dump();
    if (h.size() % 2 == 0) h += ' ';  // 8 + odd: every tensor starts at an odd address
    st.write(s.path(shard), h, -1, /*pad=*/false);
  }
  const std::string args = " generate --prompt-ids 1,2,3,4 --max-new-tokens 4 --ignore-eos --model ";
  const auto aligned = test::run_command(test::epmoe() + args + test::fixture("qwen3moe-tiny-mixed-bf16"));
  const auto odd = test::run_command(test::epmoe() + args + s.dir());
  ASSERT_EQ(aligned.exit_code, 0) << aligned.output;
  EXPECT_EQ(odd.exit_code, 0) << odd.output;
  EXPECT_EQ(odd.output, aligned.output);
}

// ---- the table in docs/hostile-inputs.md lists exactly these tests ----

std::set<std::string> ids_in_docs() {
  const std::string doc = test::read_file(test::data_dir() + "/../../docs/hostile-inputs.md");
  std::set<std::string> ids;
  const std::regex row(R"(\n\|[^|\n]*\|[^|\n]*\|[^|\n]*\| *`([a-zA-Z0-9_]+)` *\|)");
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), row); it != std::sregex_iterator(); ++it)
    ids.insert((*it)[1]);
  return ids;
}

std::set<std::string> ids_in_tests() {
  std::set<std::string> ids;
  for (const auto& r : all_rows()) ids.insert(r.id);
  ids.insert("ep_more_ranks_than_physical_experts");
  ids.insert("safetensors_misaligned_tensors");
  return ids;
}

TEST(HostileInputs, EveryDocsRowIsATest) {
  const auto docs = ids_in_docs(), tests = ids_in_tests();
  for (const auto& id : docs) EXPECT_TRUE(tests.count(id)) << "docs/hostile-inputs.md row '" << id << "' has no test";
  for (const auto& id : tests) EXPECT_TRUE(docs.count(id)) << "test '" << id << "' is missing from docs/hostile-inputs.md";
  EXPECT_GE(docs.size(), 25u);
}

}  // namespace
}  // namespace epmoe
