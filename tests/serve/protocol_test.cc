// The wire formats of `epmoe serve` without HTTP (serve/protocol.h): requests of both APIs parsed
// into what the engine runs, each refusal naming its field, and responses in sglang's and
// OpenAI's shapes with log-probs that read back as the same fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "common/golden.h"
#include "serve/protocol.h"

namespace epmoe {
namespace {

using nlohmann::json;

struct Fixture : ::testing::Test {
  Tokenizer tok = Tokenizer::load(test::data_dir() + "/bpe-tokenizer");
  ServedModel m;
  void SetUp() override {
    m.name = "tiny";
    m.path = "/models/tiny";
    m.vocab_size = 3000;
    m.max_positions = 64;
    m.eos_ids = {2};
    m.tokenizer = &tok;
  }
  // The field a refused body names.
  std::string refused(const json& body, bool native = true) {
    try {
      if (native) parse_generate(body, m);
      else parse_completion(body, m);
    } catch (const HttpError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_NE(std::string(e.what()).find(e.field), std::string::npos) << e.what();
      return e.field;
    }
    return "(accepted)";
  }
};

TEST_F(Fixture, NativeRequestBecomesWhatTheEngineRuns) {
  const json body = {{"text", "Hello, world"},
                     {"rid", "r1"},
                     {"return_logprob", true},
                     {"logprob_start_len", 0},
                     {"top_logprobs_num", 3},
                     {"sampling_params",
                      {{"max_new_tokens", 7}, {"temperature", 0.5}, {"top_k", 10}, {"stop", "xy"},
                       {"stop_token_ids", {5}}, {"n", 2}, {"sampling_seed", 99}, {"no_stop_trim", true}}}};
  const NativeCall c = parse_generate(body, m);
  ASSERT_EQ(c.requests.size(), 1u);
  const ServeRequest& r = c.requests[0];
  EXPECT_EQ(r.prompt, tok.encode("Hello, world"));
  EXPECT_EQ(r.rid, "r1");
  EXPECT_EQ(r.params.max_new_tokens, 7);
  EXPECT_EQ(r.params.sampling.temperature, 0.5f);
  EXPECT_EQ(r.params.sampling.top_k, 10);
  EXPECT_EQ(r.params.stop_ids, (std::vector<int>{5, 2})) << "stop_token_ids, then eos";
  EXPECT_EQ(r.stop_strings, std::vector<std::string>{"xy"});
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.seed, 99u);
  EXPECT_TRUE(r.params.logprobs);
  EXPECT_EQ(r.params.top_logprobs, 3);
  EXPECT_EQ(r.params.input_logprobs_from, 0);
  EXPECT_TRUE(r.no_stop_trim);
  EXPECT_FALSE(c.batch);

  const json ign = {{"input_ids", {1, 2}}, {"sampling_params", {{"ignore_eos", true}, {"temperature", 0}}}};
  const ServeRequest g = parse_generate(ign, m).requests[0];
  EXPECT_TRUE(g.params.stop_ids.empty()) << "ignore_eos drops the eos ids";
  EXPECT_FALSE(g.seed_reported) << "greedy without a seed reports none";
  EXPECT_EQ(g.params.max_new_tokens, 63) << "sglang's default of 128, cut to the 64 - 2 + 1 positions left";
  m.max_positions = 4096;
  EXPECT_EQ(parse_generate(ign, m).requests[0].params.max_new_tokens, 128) << "sglang's default";
}

TEST_F(Fixture, ListsAreBatchesWithPerPromptRidsAndParams) {
  const json body = {{"input_ids", {{1, 2}, {3, 4, 5}}},
                     {"rid", {"a", "b"}},
                     {"sampling_params", {{{"max_new_tokens", 1}}, {{"max_new_tokens", 2}}}}};
  const NativeCall c = parse_generate(body, m);
  ASSERT_EQ(c.requests.size(), 2u);
  EXPECT_TRUE(c.batch);
  EXPECT_EQ(c.requests[1].rid, "b");
  EXPECT_EQ(c.requests[1].params.max_new_tokens, 2);
  EXPECT_EQ(c.requests[1].prompt, (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(refused({{"input_ids", {{1}, {2}}}, {"rid", {"a"}}}), "rid");
}

TEST_F(Fixture, EveryRefusalNamesItsField) {
  EXPECT_EQ(refused({{"input_ids", {1, 3000}}}), "input_ids");
  EXPECT_EQ(refused({{"input_ids", json::array()}}), "input_ids");
  EXPECT_EQ(refused({{"input_ids", std::vector<int>(65, 1)}}), "input_ids");
  EXPECT_EQ(refused({{"input_ids", {1}}, {"sampling_params", {{"max_new_tokens", 65}}}}), "sampling_params.max_new_tokens");
  EXPECT_EQ(refused({{"input_ids", {1}}, {"sampling_params", {{"max_new_tokens", 1.5}}}}), "sampling_params.max_new_tokens");
  EXPECT_EQ(refused({{"input_ids", {1}}, {"sampling_params", {{"min_p", 2}}}}), "sampling_params.min_p");
  EXPECT_EQ(refused({{"input_ids", {1}}, {"sampling_params", {{"stop", {1}}}}}), "sampling_params.stop");
  EXPECT_EQ(refused({{"input_ids", {1}}, {"top_logprobs_num", 21}}), "top_logprobs_num");
  EXPECT_EQ(refused({{"input_ids", {1}}, {"logprob_start_len", -2}}), "logprob_start_len");
  EXPECT_EQ(refused(json::array()), "body");
  EXPECT_EQ(refused({{"prompt", "x"}, {"model", "other"}}, false), "model");
  EXPECT_EQ(refused({{"prompt", "x"}, {"max_tokens", -1}}, false), "max_tokens");
  EXPECT_EQ(refused({{"prompt", "x"}, {"presence_penalty", 3}}, false), "presence_penalty");
  EXPECT_EQ(refused({{"prompt", {{1, 2}, "x", 3}}}, false), "prompt[2]");
  EXPECT_EQ(refused({{"max_tokens", 3}}, false), "prompt");
  ServedModel ids_only = m;
  ids_only.tokenizer = nullptr;
  EXPECT_THROW(parse_generate({{"text", "hi"}}, ids_only), HttpError);
}

TEST_F(Fixture, OpenAIDefaultsAndChatTemplate) {
  const OpenAICall c = parse_completion({{"prompt", {{1, 2}, {3}}}, {"n", 2}, {"logprobs", 0}, {"seed", 5}}, m);
  ASSERT_EQ(c.requests.size(), 2u);
  EXPECT_EQ(c.requests[0].params.max_new_tokens, 16) << "OpenAI's default";
  EXPECT_EQ(c.requests[0].params.sampling.temperature, 1.0f);
  EXPECT_TRUE(c.requests[0].params.logprobs);
  EXPECT_EQ(c.requests[0].params.top_logprobs, 0);
  EXPECT_EQ(c.requests[1].seed, 5u);
  const json msgs = {{{"role", "system"}, {"content", "Be brief."}},
                     {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi"}}}}}};
  EXPECT_EQ(chatml_prompt(msgs, tok),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(chatml_prompt(msgs, tok), tok.chat_prompt("Hi", "Be brief.")) << "the CLI's --chat template";
  const OpenAICall chat = parse_chat({{"messages", msgs}, {"logprobs", true}, {"top_logprobs", 2}}, m);
  EXPECT_EQ(chat.requests[0].prompt, tok.encode(tok.chat_prompt("Hi", "Be brief.")));
  EXPECT_EQ(chat.logprobs, 2);
}

TEST_F(Fixture, ResponsesCarryLogprobsThatReadBackAsTheSameFloats) {
  ServeRequest r;
  r.rid = "x";
  r.prompt = {4, 5, 6};
  r.n = 1;
  Job job(r);
  job.samples.resize(1);
  SampleProgress& s = job.samples[0];
  const float lps[3] = {-0.1f, -1e-7f, -12.345678f};
  s.tokens = {7, 8, 9};
  s.logprobs.assign(lps, lps + 3);
  s.top = {{{7, lps[0]}}, {{8, lps[1]}}, {{9, lps[2]}}};
  s.text = tok.decode(s.tokens);
  s.text_offset = {0, 1, 2};
  s.done = true;
  s.finish = FinishReason::Stop;
  s.matched_id = 9;
  job.input_logprobs = {-3.25f, -0.5f};
  job.state = Job::State::Done;
  NativeCall call;
  call.return_logprob = true;
  call.logprob_start_len = 0;
  call.top_logprobs_num = 1;
  const json out = json::parse(dump_json(native_result(job, 0, call, m)));
  const json& meta = out["meta_info"];
  EXPECT_EQ(meta["finish_reason"]["type"], "stop");
  EXPECT_EQ(meta["finish_reason"]["matched"], 9);
  EXPECT_EQ(meta["completion_tokens"], 3);
  ASSERT_EQ(meta["output_token_logprobs"].size(), 3u);
  for (size_t i = 0; i < 3; i++) {
    const float back = float(meta["output_token_logprobs"][i][0].get<double>());
    EXPECT_EQ(std::memcmp(&back, &lps[i], 4), 0) << i;
    EXPECT_EQ(meta["output_token_logprobs"][i][1], s.tokens[i]);
  }
  ASSERT_EQ(meta["input_token_logprobs"].size(), 3u);
  EXPECT_TRUE(meta["input_token_logprobs"][0][0].is_null()) << "the first prompt token has no log-prob";
  EXPECT_EQ(meta["input_token_logprobs"][2][0].get<double>(), -0.5);
  EXPECT_EQ(meta["output_top_logprobs"][2][0][1], 9);

  const json lp = openai_logprobs(s, 0, 3, false, 1, m);
  EXPECT_EQ(lp["token_logprobs"].size(), 3u);
  EXPECT_EQ(lp["text_offset"][2], 2);
  const json chat = openai_logprobs(s, 1, 2, true, 1, m);
  ASSERT_EQ(chat["content"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["token"], std::string(tok.token_bytes(8)));
  EXPECT_EQ(chat["content"][0]["bytes"].size(), tok.token_bytes(8).size());
}


// The fp32 printer: on 200000 random finite floats (random bits: every exponent) and a few
// chosen ones, the text reads back (strtof) as the same bits, and no decimal with fewer
// significant digits does (%.*e at every shorter precision fails to read back).
TEST(Fp32Text, ShortestAndReadsBackAsTheSameBits) {
  std::mt19937 rng(38);
  std::vector<float> values = {-8.034802f, 0.0f, -0.0f, 1.0f, -1e-7f, 3.4028235e38f, 1.4e-45f, 16777216.0f,
                               -0.1f, 0.3f, 100.0f};
  while (values.size() < 200000) {
    const uint32_t bits = rng();
    float v;
    std::memcpy(&v, &bits, 4);
    if (std::isfinite(v)) values.push_back(v);
  }
  auto significant = [](const std::string& t) {
    std::string mant = t.substr(0, t.find('e'));
    std::string d;
    for (char c : mant)
      if (c >= '0' && c <= '9') d += c;
    const size_t a = d.find_first_not_of('0');
    if (a == std::string::npos) return size_t(1);
    const size_t b = d.find_last_not_of('0');
    return b - a + 1;
  };
  size_t checked = 0;
  for (float v : values) {
    const std::string t = fp32_text(v);
    const float back = std::strtof(t.c_str(), nullptr);
    ASSERT_EQ(std::memcmp(&back, &v, 4), 0) << t;
    ASSERT_NE(t.find_first_of(".e"), std::string::npos) << t << ": a JSON float, not an integer";
    const size_t digits = significant(t);
    char buf[64];
    for (size_t p = 1; p < digits; p++) {
      std::snprintf(buf, sizeof buf, "%.*e", int(p - 1), double(v));
      const float shorter = std::strtof(buf, nullptr);
      ASSERT_NE(std::memcmp(&shorter, &v, 4), 0) << t << " is not the shortest: " << buf << " reads back too";
    }
    ASSERT_EQ(dump_json(json_fp32(v)), t);
    checked++;
  }
  EXPECT_EQ(checked, values.size());
  EXPECT_EQ(fp32_text(-8.034802f), "-8.034802") << "issue 38's example (nlohmann printed -8.034802000000001)";
  // Inside documents too, next to doubles that are not fp32 values (printed as doubles).
  const json doc = {{"lp", json::array({json_fp32(-8.034802f), json_fp32(0.0f)})}, {"t", 0.1}};
  EXPECT_EQ(dump_json(doc), R"({"lp":[-8.034802,0.0],"t":0.1})");
  EXPECT_EQ(dump_json(json_fp32(NAN)), "null");
}

TEST_F(Fixture, SeedsAreUnsigned64BitAndNegativeOnesAreRefused) {
  EXPECT_EQ(refused({{"input_ids", {1}}, {"sampling_params", {{"sampling_seed", -3}}}}),
            "sampling_params.sampling_seed");
  EXPECT_EQ(refused({{"prompt", "x"}, {"seed", -1}}, false), "seed");
  EXPECT_EQ(refused({{"input_ids", {1}}, {"sampling_params", {{"sampling_seed", 1.5}}}}),
            "sampling_params.sampling_seed");
  // A reported seed can be anything up to 2^64 - 1: it replays.
  const json big = json::parse(R"({"input_ids": [1], "sampling_params": {"sampling_seed": 18446744073709551615}})");
  EXPECT_EQ(parse_generate(big, m).requests[0].seed, UINT64_MAX);
  EXPECT_EQ(parse_completion({{"prompt", "x"}, {"seed", 7}}, m).requests[0].seed, 7u);
}

// Penalties, logit_bias and the minimum length reach the engine as its LogitProcessing, on both
// APIs; out-of-range values are refused naming their field.
TEST_F(Fixture, PenaltiesBiasAndMinimumBecomeTheEnginesProcessing) {
  const NativeCall c = parse_generate(
      {{"input_ids", {1, 2}},
       {"sampling_params",
        {{"max_new_tokens", 5}, {"frequency_penalty", 0.5}, {"presence_penalty", -0.25}, {"repetition_penalty", 1.25},
         {"logit_bias", {{"7", 3}, {"2", -100}}}, {"min_new_tokens", 2}}}},
      m);
  const LogitProcessing& p = c.requests[0].params.processing;
  EXPECT_EQ(p.frequency_penalty, 0.5f);
  EXPECT_EQ(p.presence_penalty, -0.25f);
  EXPECT_EQ(p.repetition_penalty, 1.25f);
  EXPECT_EQ(p.min_new_tokens, 2);
  const std::vector<std::pair<int32_t, float>> bias = {{2, -100.0f}, {7, 3.0f}};  // sorted by id
  EXPECT_EQ(p.logit_bias, bias);
  EXPECT_FALSE(parse_generate({{"input_ids", {1, 2}}}, m).requests[0].params.processing.active());
  const OpenAICall o = parse_completion(
      {{"prompt", "x"}, {"max_tokens", 4}, {"min_tokens", 3}, {"logit_bias", {{"5", 1.5}}}, {"frequency_penalty", 1}}, m);
  EXPECT_EQ(o.requests[0].params.processing.min_new_tokens, 3);
  EXPECT_EQ(o.requests[0].params.processing.frequency_penalty, 1.0f);
  EXPECT_EQ(o.requests[0].params.processing.logit_bias.size(), 1u);
  const json ids = {1, 2};
  for (const auto& [sp, field] : std::vector<std::pair<json, std::string>>{
           {{{"frequency_penalty", 2.5}}, "sampling_params.frequency_penalty"},
           {{{"presence_penalty", -3}}, "sampling_params.presence_penalty"},
           {{{"repetition_penalty", 0}}, "sampling_params.repetition_penalty"},
           {{{"logit_bias", {{"x", 1}}}}, "sampling_params.logit_bias"},
           {{{"logit_bias", {{"5", 101}}}}, "sampling_params.logit_bias"},
           {{{"logit_bias", {{"-1", 1}}}}, "sampling_params.logit_bias"},
           {{{"logit_bias", json::array({1})}}, "sampling_params.logit_bias"},
           {{{"min_new_tokens", 9}, {"max_new_tokens", 4}}, "sampling_params.min_new_tokens"},
           {{{"min_new_tokens", -1}}, "sampling_params.min_new_tokens"}})
    EXPECT_EQ(refused({{"input_ids", ids}, {"sampling_params", sp}}), field) << sp.dump();
  EXPECT_EQ(refused({{"prompt", "x"}, {"max_tokens", 2}, {"min_tokens", 3}}, false), "min_tokens");
}

TEST_F(Fixture, NoFieldIsIgnored) {
  const json ids = {1, 2};
  // Unknown fields, at every level, are refused by name.
  EXPECT_EQ(refused({{"input_ids", ids}, {"max_token", 3}}), "max_token");
  EXPECT_EQ(refused({{"input_ids", ids}, {"sampling_params", {{"max_token", 3}}}}), "sampling_params.max_token");
  EXPECT_EQ(refused({{"prompt", "x"}, {"max_new_tokens", 3}}, false), "max_new_tokens");
  EXPECT_EQ(refused({{"prompt", "x"}, {"stream_options", {{"include_usag", true}}}}, false),
            "stream_options.include_usag");
  // Known fields that are not implemented: refused with an effective value...
  for (const char* k : {"regex", "json_schema", "ebnf", "stop_regex", "custom_params"}) {
    json v = json("a+");
    if (std::string(k) == "custom_params") v = json{{"a", 1}};
    EXPECT_EQ(refused({{"input_ids", ids}, {"sampling_params", {{k, v}}}}), std::string("sampling_params.") + k);
  }
  for (const char* k : {"return_hidden_states", "lora_path", "custom_logit_processor", "token_ids_logprob",
                        "image_data"}) {
    const json v = std::string(k) == "return_hidden_states" ? json(true)
                   : std::string(k) == "token_ids_logprob"  ? json({5})
                                                            : json("x");
    EXPECT_EQ(refused({{"input_ids", ids}, {k, v}}), k);
  }
  // ... accepted at their no-op value (what clients send as defaults).
  EXPECT_EQ(refused({{"input_ids", ids},
                     {"image_data", nullptr},
                     {"return_hidden_states", false},
                     {"sampling_params",
                      {{"frequency_penalty", 0.0}, {"repetition_penalty", 1.0}, {"logit_bias", json::object()},
                       {"min_new_tokens", 0}, {"spaces_between_special_tokens", false}}}}),
            "(accepted)");
  // OpenAI: response_format text is what no format means; json_object / json_schema are refused.
  EXPECT_NO_THROW(parse_completion({{"prompt", "x"}, {"response_format", {{"type", "text"}}}}, m));
  EXPECT_EQ(refused({{"prompt", "x"}, {"response_format", {{"type", "json_object"}}}}, false), "response_format");
  EXPECT_EQ(refused({{"prompt", "x"}, {"response_format", "bogus"}}, false), "response_format");
  const json msgs = {{{"role", "user"}, {"content", "Hi"}}};
  auto chat_refused = [&](json body) -> std::string {
    body["messages"] = body.contains("messages") ? body["messages"] : msgs;
    try {
      parse_chat(body, m);
    } catch (const HttpError& e) {
      return e.field;
    }
    return "(accepted)";
  };
  EXPECT_EQ(chat_refused({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}), "tools");
  EXPECT_EQ(chat_refused({{"tool_choice", "required"}}), "tool_choice");
  EXPECT_EQ(chat_refused({{"tools", json::array()}, {"tool_choice", "none"}, {"user", "u"}}), "(accepted)");
  EXPECT_EQ(chat_refused({{"chat_template_kwargs", {{"enable_thinking", false}}}}), "chat_template_kwargs");
  EXPECT_EQ(chat_refused({{"messages", {{{"role", "user"}, {"content", "Hi"}, {"name", "bob"}}}}}),
            "messages[0].name");
  EXPECT_EQ(chat_refused({{"messages", {{{"role", "user"},
                                         {"content", {{{"type", "image_url"}, {"image_url", {{"url", "x"}}}}}}}}}}),
            "messages[0].content[0].type");
  // rid on the OpenAI routes names the request for /abort_request.
  EXPECT_EQ(parse_completion({{"prompt", "x"}, {"rid", "mine"}}, m).requests[0].rid, "mine");
  EXPECT_EQ(parse_completion({{"prompt", {"x", "y"}}, {"rid", {"a", "b"}}}, m).requests[1].rid, "b");
  EXPECT_TRUE(parse_completion({{"prompt", "x"}, {"no_stop_trim", true}}, m).requests[0].no_stop_trim);
}

TEST_F(Fixture, TokenizeAndDetokenizeRoundTrip) {
  const std::string text = "Hello, world: caf\xc3\xa9!";
  const json t = tokenize({{"prompt", text}}, m);
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), tok.encode(text));
  EXPECT_EQ(t["count"], tok.encode(text).size());
  EXPECT_EQ(t["max_model_len"], 64);
  EXPECT_EQ(detokenize({{"tokens", t["tokens"]}}, m)["text"], text);
  const json batch = tokenize({{"prompt", {"a b", "c"}}}, m);
  ASSERT_EQ(batch["tokens"].size(), 2u);
  EXPECT_EQ(detokenize({{"tokens", batch["tokens"]}}, m)["text"], json({"a b", "c"}));
  const json msgs = {{{"role", "user"}, {"content", "Hi"}}};
  EXPECT_EQ(tokenize({{"messages", msgs}}, m)["tokens"].get<std::vector<int32_t>>(),
            parse_chat({{"messages", msgs}}, m).requests[0].prompt)
      << "the ids /v1/chat/completions runs";
  auto field = [&](auto fn, const json& body) -> std::string {
    try {
      fn(body, m);
    } catch (const HttpError& e) {
      return e.field;
    }
    return "(accepted)";
  };
  EXPECT_EQ(field(tokenize, {{"text", "x"}}), "text");
  EXPECT_EQ(field(tokenize, json::object()), "prompt");
  EXPECT_EQ(field(detokenize, {{"tokens", {1, 3000}}}), "tokens");
  EXPECT_EQ(field(detokenize, {{"tokens", {1}}, {"model", "other"}}), "model");
  const int32_t im_end = *tok.token_id("<|im_end|>");
  EXPECT_EQ(detokenize({{"tokens", {im_end}}, {"skip_special_tokens", false}}, m)["text"], "<|im_end|>");
  EXPECT_EQ(detokenize({{"tokens", {im_end}}}, m)["text"], "") << "sglang's default skips special tokens";
  EXPECT_EQ(model_card(m)["id"], "tiny");
}

TEST_F(Fixture, TextInLogprobsMatchedStopAndTheEndOfASample) {
  ServeRequest r = parse_generate({{"input_ids", {4, 5}}, {"sampling_params", {{"max_new_tokens", 3}}}}, m).requests[0];
  Job job(r);
  job.samples.resize(1);
  SampleProgress& s = job.samples[0];
  s.tokens = {7, 8};
  s.logprobs = {-0.5f, -1.5f};
  EXPECT_FALSE(sample_ends_at_last_token(r, s));
  s.tokens.push_back(2);  // eos
  s.logprobs.push_back(-2.5f);
  EXPECT_TRUE(sample_ends_at_last_token(r, s)) << "an eos id ends the sample";
  s.tokens.back() = 9;
  EXPECT_TRUE(sample_ends_at_last_token(r, s)) << "max_new_tokens reached";
  s.tokens.pop_back();
  s.matched_stop = "xy";
  EXPECT_TRUE(sample_ends_at_last_token(r, s)) << "a stop string completed";
  s.matched_stop.clear();
  s.tokens.push_back(2);
  s.done = true;
  s.finish = FinishReason::Stop;
  s.matched_id = 2;
  job.state = Job::State::Done;
  EXPECT_EQ(openai_matched_stop(s), 2);
  s.matched_stop = "xy";
  EXPECT_EQ(openai_matched_stop(s), "xy");
  s.finish = FinishReason::Length;
  EXPECT_TRUE(openai_matched_stop(s).is_null());

  const NativeCall call = parse_generate({{"input_ids", {4, 5}}, {"return_logprob", true}, {"logprob_start_len", 0},
                                          {"return_text_in_logprobs", true}},
                                         m);
  const json out = native_result(job, 0, call, m);
  const json& lps = out["meta_info"]["output_token_logprobs"];
  ASSERT_EQ(lps.size(), 3u);
  for (size_t i = 0; i < 3; i++) EXPECT_EQ(lps[i][2], tok.decode({s.tokens[i]})) << i;
  EXPECT_EQ(out["meta_info"]["input_token_logprobs"][0][2], tok.decode({4}));
  ServedModel ids_only = m;
  ids_only.tokenizer = nullptr;
  EXPECT_THROW(parse_generate({{"input_ids", {1}}, {"return_text_in_logprobs", true}}, ids_only), HttpError);
}

}  // namespace
}  // namespace epmoe
