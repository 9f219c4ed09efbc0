// The OpenAI API of `epmoe serve` (HttpServer's OpenAI routes): /v1/models, /v1/completions and
// /v1/chat/completions (one handler, two wire shapes), /v1/responses; whole or streamed (SSE).
#include "serve/http_server.h"

#include <memory>
#include <mutex>

#include "serve/http_util.h"

namespace epmoe {

using nlohmann::json;

namespace {

// /v1/completions (chat false) and /v1/chat/completions (chat true): the same jobs, chunks and
// usage, in the two wire shapes.
void openai_call(ServeEngine& engine, const ServedModel& model, const httplib::Request& req, httplib::Response& res,
                 bool chat) {
  const json body = parse_body(req);
  auto call = std::make_shared<OpenAICall>(chat ? parse_chat(body, model) : parse_completion(body, model));
  std::vector<JobPtr> jobs = submit_all(engine, call->requests);
  if (!call->stream) {
    wait_all(jobs);
    json out;
    {
      std::vector<std::unique_lock<std::mutex>> locks;
      for (auto& j : jobs) locks.emplace_back(j->mu);
      out = openai_response(*call, jobs, model);
    }
    send_json(res, 200, out);
    return;
  }
  auto st = std::make_shared<StreamState>(jobs);
  const ServedModel& m = model;
  auto chunk = [call](json choices) {
    return json{{"id", call->id},
                {"object", call->chat ? "chat.completion.chunk" : "text_completion"},
                {"created", call->created},
                {"model", call->model},
                {"choices", std::move(choices)}};
  };
  stream_response(
      res, engine, st,
      [call, &m, chunk](StreamState& st, httplib::DataSink& sink, bool& wrote) {
        for (size_t p = 0; p < st.jobs.size(); p++) {
          Job& job = *st.jobs[p];
          for (size_t k = 0; k < st.sent_final[p].size(); k++) {
            std::vector<std::string> events;
            {
              std::lock_guard<std::mutex> lock(job.mu);
              if (job.samples.size() <= k || st.sent_final[p][k]) continue;
              const SampleProgress& s = job.samples[k];
              const size_t index = p * size_t(job.req.n) + k;
              if (call->chat && !st.sent_role[p][k]) {
                json c = {{"index", index}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                          {"logprobs", nullptr}, {"finish_reason", nullptr}};
                json ev = chunk(json::array({c}));
                if (call->return_token_ids) ev["prompt_token_ids"] = job.req.prompt;
                events.push_back(dump_json(ev));
                st.sent_role[p][k] = true;
              }
              const bool final_now = s.done && job.state == Job::State::Done;
              // A token that ends its sample waits for the end (within the engine's step), so that
              // it goes out with the finish reason and the final text (what the decoder or a
              // possible stop string held back): the last chunk then carries tokens, never a
              // chunk of empty log-prob arrays after them.
              const bool hold = !final_now && sample_ends_at_last_token(job.req, s);
              const size_t nt = s.tokens.size(), tt = s.text.size();
              if (!hold && (nt > st.sent_tokens[p][k] || tt > st.sent_text[p][k] || final_now)) {
                const std::string delta = s.text.substr(std::min(st.sent_text[p][k], tt));
                json c;
                c["index"] = index;
                if (call->chat) {
                  c["delta"] = final_now && delta.empty() ? json::object() : json{{"content", delta}};
                } else {
                  c["text"] = delta;
                }
                // No new token (an abort, or max_tokens 0): logprobs null, not empty arrays.
                c["logprobs"] = call->logprobs >= 0 && nt > st.sent_tokens[p][k]
                                    ? openai_logprobs(s, st.sent_tokens[p][k], nt - st.sent_tokens[p][k], call->chat,
                                                      call->logprobs, m)
                                    : json(nullptr);
                c["finish_reason"] = final_now ? openai_finish(s) : json(nullptr);
                c["matched_stop"] = final_now ? openai_matched_stop(s) : json(nullptr);
                if (final_now) add_routing(c, *call, s, m);
                if (call->return_token_ids) {
                  c["token_ids"] = std::vector<int32_t>(s.tokens.begin() + long(std::min(st.sent_tokens[p][k], nt)),
                                                        s.tokens.end());
                  if (!call->chat && !st.sent_ids[p][k]) c["prompt_token_ids"] = job.req.prompt;
                  st.sent_ids[p][k] = true;
                }
                events.push_back(dump_json(chunk(json::array({c}))));
                st.sent_tokens[p][k] = nt;
                st.sent_text[p][k] = tt;
                st.sent_final[p][k] = final_now;
              }
            }
            for (auto& ev : events) {
              wrote = true;
              if (!write_event(sink, st, ev)) return false;
            }
          }
        }
        return true;
      },
      [call, chunk](StreamState& st, httplib::DataSink& sink) {
        if (!call->include_usage) return true;
        json u = chunk(json::array());
        {
          std::vector<std::unique_lock<std::mutex>> locks;
          for (auto& j : st.jobs) locks.emplace_back(j->mu);
          u["usage"] = openai_usage(st.jobs);
        }
        return write_event(sink, st, dump_json(u));
      });
}

}  // namespace

// The served model, as OpenAI's model list (clients look the name up here).
void HttpServer::list_models(const Req&, Res& res) {
  send_json(res, 200, {{"object", "list"}, {"data", json::array({model_card(model_)})}});
}

// One model by id (the served name, or its path as /v1/models' `root`); OpenAI's 404 otherwise.
void HttpServer::get_model(const Req& req, Res& res) {
  const std::string id = req.matches[1];
  if (id == model_.name || id == model_.path) {
    send_json(res, 200, model_card(model_));
    return;
  }
  json e = error_body(404, "The model '" + id + "' does not exist (this server serves '" + model_.name + "')", "model");
  e["error"]["type"] = "invalid_request_error";
  e["error"]["code"] = "model_not_found";
  send_json(res, 404, e);
}

// OpenAI's Responses API: one assistant message; streamed as its named events (response.created,
// ...output_text.delta..., response.completed), with no [DONE] line (OpenAI sends none there).
void HttpServer::responses(const Req& req, Res& res) {
  const json body = parse_body(req);
  auto call = std::make_shared<ResponsesCall>(parse_responses(body, model_));
  std::vector<JobPtr> jobs = submit_all(engine_, {call->request});
  if (!call->stream) {
    wait_all(jobs);
    json out;
    {
      std::lock_guard<std::mutex> lock(jobs[0]->mu);
      out = responses_object(*call, *jobs[0], true);
    }
    send_json(res, 200, out);
    return;
  }
  auto st = std::make_shared<StreamState>(jobs);
  auto seq = std::make_shared<int64_t>(0);
  stream_response(
      res, engine_, st,
      [call, seq](StreamState& st, httplib::DataSink& sink, bool& wrote) {
        std::vector<std::string> events;
        auto event = [&](const char* type, json data) {
          data["type"] = type;
          data["sequence_number"] = (*seq)++;
          events.push_back(std::string("event: ") + type + "\ndata: " + dump_json(data) + "\n\n");
        };
        const json part0 = {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}};
        {
          Job& job = *st.jobs[0];
          std::lock_guard<std::mutex> lock(job.mu);
          if (!st.sent_role[0][0]) {
            const json r = responses_object(*call, job, false);
            event("response.created", {{"response", r}});
            event("response.in_progress", {{"response", r}});
            event("response.output_item.added",
                  {{"output_index", 0},
                   {"item", {{"type", "message"}, {"id", call->message_id}, {"status", "in_progress"},
                             {"role", "assistant"}, {"content", json::array()}}}});
            event("response.content_part.added",
                  {{"item_id", call->message_id}, {"output_index", 0}, {"content_index", 0}, {"part", part0}});
            st.sent_role[0][0] = true;
          }
          if (!job.samples.empty() && !st.sent_final[0][0]) {
            const SampleProgress& s = job.samples[0];
            const bool final_now = s.done && job.state == Job::State::Done;
            const bool hold = !final_now && sample_ends_at_last_token(job.req, s);
            if (!hold && s.text.size() > st.sent_text[0][0]) {
              event("response.output_text.delta", {{"item_id", call->message_id}, {"output_index", 0},
                                                   {"content_index", 0}, {"delta", s.text.substr(st.sent_text[0][0])},
                                                   {"logprobs", json::array()}});
              st.sent_text[0][0] = s.text.size();
            }
            if (final_now) {
              const json r = responses_object(*call, job, true);
              const json part = r["output"][0]["content"][0];
              event("response.output_text.done", {{"item_id", call->message_id}, {"output_index", 0},
                                                  {"content_index", 0}, {"text", s.text}, {"logprobs", json::array()}});
              event("response.content_part.done",
                    {{"item_id", call->message_id}, {"output_index", 0}, {"content_index", 0}, {"part", part}});
              event("response.output_item.done", {{"output_index", 0}, {"item", r["output"][0]}});
              const std::string status = r["status"];
              event(status == "completed" ? "response.completed"
                                          : status == "incomplete" ? "response.incomplete" : "response.failed",
                    {{"response", r}});
              st.sent_final[0][0] = true;
            }
          }
        }
        for (auto& ev : events) {
          wrote = true;
          st.last_write = std::chrono::steady_clock::now();
          if (!sink.write(ev.data(), ev.size())) return false;
        }
        return true;
      },
      {}, /*done_marker=*/false);
}

// OpenAI's text completions (a prompt, or a batch of prompts).
void HttpServer::completions(const Req& req, Res& res) { openai_call(engine_, model_, req, res, false); }

// OpenAI's chat completions (messages through the model's chat template).
void HttpServer::chat_completions(const Req& req, Res& res) { openai_call(engine_, model_, req, res, true); }

}  // namespace epmoe
