// The wire formats of `epmoe serve` without HTTP (serve/protocol.h): requests of both APIs parsed
// into what the engine runs, each refusal naming its field, and responses in sglang's and
// OpenAI's shapes with log-probs that read back as the same fp32.
#include <gtest/gtest.h>

#include <cstring>

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
  EXPECT_EQ(refused({{"prompt", "x"}, {"presence_penalty", 1}}, false), "presence_penalty");
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

}  // namespace
}  // namespace epmoe
