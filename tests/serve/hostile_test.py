"""Hostile HTTP against `epmoe serve` (tests/serve, ctest serve.hostile).

Bad input gets HTTP 400 with a JSON error naming the field; a missing or wrong API key 401; a
slow client, 200 connections opened and dropped, and a stream cut mid-way neither crash the server
nor leak KV blocks: afterwards it still answers, the same request gives the same bits as before,
and no block is held.
"""
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_harness as h  # noqa: E402

KEY = "sekret-key"
check = h.Checks()


def request(url, path, body=None, raw=None, key=KEY, method=None, ctype="application/json"):
    """(status, parsed JSON or text) of one request."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    headers = {"Content-Type": ctype}
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def expect_error(url, path, body, status, field, what, raw=None, key=KEY):
    got, j = request(url, path, body, raw=raw, key=key)
    ok = got == status and isinstance(j, dict) and "error" in j
    if ok and field is not None:
        ok = j["error"].get("param") == field and field in j["error"].get("message", "")
    check(ok, "%s -> %d naming %s (got %d %s)" % (what, status, field, got, str(j)[:160]))


def http_head(url):
    host, port = url.split("//")[1].split(":")
    return host, int(port)


def greedy(url):
    body = {"input_ids": [5, 6, 7, 8, 9], "sampling_params": {"max_new_tokens": 6, "temperature": 0},
            "return_logprob": True}
    st, j = request(url, "/generate", body)
    return st, (j["output_ids"], [x[0] for x in j["meta_info"]["output_token_logprobs"]]) if st == 200 else j


def main():
    model = h.text_model()
    with h.Server(model, args=["--max-body-mb", "1"], api_key=KEY) as s:
        url = s.url
        st, before = greedy(url)
        check(st == 200, "a plain request works (%d)" % st)
        # ---- keys ----
        expect_error(url, "/v1/models", None, 401, None, "no API key", key=None)
        expect_error(url, "/generate", {"input_ids": [1]}, 401, None, "a wrong API key", key="nope")
        got, _ = request(url, "/health", key=None)
        check(got == 200, "/health needs no key (%d)" % got)
        # ---- bad input ----
        expect_error(url, "/generate", None, 400, "body", "malformed JSON", raw=b'{"input_ids": [1, 2')
        expect_error(url, "/generate", None, 400, "body", "an empty body", raw=b"")
        expect_error(url, "/generate", [1, 2], 400, "body", "a JSON list as the body")
        expect_error(url, "/generate", None, 400, "body", "a body over the size limit",
                     raw=b'{"text": "' + b"a" * (2 << 20) + b'"}')
        expect_error(url, "/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 400, "model", "an unknown model")
        expect_error(url, "/v1/completions", {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens",
                     "negative max_tokens")
        expect_error(url, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": -1}}, 400,
                     "sampling_params.max_new_tokens", "negative max_new_tokens")
        expect_error(url, "/generate", {"input_ids": [1] * 5000}, 400, "input_ids",
                     "a prompt longer than the context")
        expect_error(url, "/v1/completions", {"prompt": [1] * 4000, "max_tokens": 200}, 400, "max_tokens",
                     "prompt + max_tokens past the context")
        expect_error(url, "/generate", {"input_ids": [1, 2, 3000]}, 400, "input_ids", "an id out of the vocabulary")
        expect_error(url, "/generate", {"input_ids": [1, -2]}, 400, "input_ids", "a negative id")
        expect_error(url, "/generate", {"input_ids": [1, "x"]}, 400, "input_ids", "a string among the ids")
        expect_error(url, "/generate", {"input_ids": []}, 400, "input_ids", "an empty prompt")
        expect_error(url, "/generate", {"input_ids": [1], "text": "a"}, 400, "input_ids", "both text and input_ids")
        expect_error(url, "/generate", {"input_ids": [1], "sampling_params": {"temperature": -1}}, 400,
                     "sampling_params.temperature", "a negative temperature")
        expect_error(url, "/generate", {"input_ids": [1], "sampling_params": {"top_p": 0}}, 400,
                     "sampling_params.top_p", "top_p 0")
        expect_error(url, "/generate", {"input_ids": [1], "sampling_params": {"n": 0}}, 400,
                     "sampling_params.n", "n 0")
        expect_error(url, "/generate", {"input_ids": [1], "sampling_params": "hot"}, 400,
                     "sampling_params", "sampling_params not an object")
        expect_error(url, "/generate", {"input_ids": [1], "stream": "yes"}, 400, "stream", "stream not a boolean")
        expect_error(url, "/v1/chat/completions", {"messages": []}, 400, "messages", "no messages")
        expect_error(url, "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400,
                     "messages[0].role", "an unknown role")
        expect_error(url, "/v1/completions", {"prompt": {"a": 1}}, 400, "prompt", "a prompt object")
        expect_error(url, "/v1/completions", {"prompt": "x", "logprobs": 1000}, 400, "logprobs", "logprobs 1000")
        expect_error(url, "/update_weights_from_disk", {"model_path": "/nonexistent"}, 400, "model_path",
                     "weights from a folder that does not exist")
        expect_error(url, "/pause_generation", {"mode": "sideways"}, 400, "mode", "an unknown pause mode")
        got, j = request(url, "/nope", {"a": 1})
        check(got == 404 and "error" in j, "an unknown endpoint -> 404 JSON (%d)" % got)

        # ---- a slow client: one byte of a request every 0.2 s, while others are served ----
        host, port = http_head(url)
        slow = socket.create_connection((host, port))
        msg = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 30\r\n"
        served = []

        def others():
            for _ in range(3):
                served.append(greedy(url)[0])

        t = threading.Thread(target=others)
        t.start()
        try:
            for b in msg[:20]:
                slow.send(bytes([b]))
                time.sleep(0.2)
        except OSError:
            pass
        t.join()
        slow.close()
        check(served == [200, 200, 200], "requests are served while a slow client dribbles (%s)" % served)

        # ---- 200 connections opened and dropped, in every state ----
        socks = []
        for i in range(200):
            try:
                c = socket.create_connection((host, port), timeout=10)
            except OSError as e:
                check(False, "connection %d refused: %s" % (i, e))
                break
            kind = i % 4
            if kind == 1:
                c.send(b"POST /generate HTTP/1.1\r\nHost: x\r\n")  # headers cut off
            elif kind == 2:
                body = json.dumps({"input_ids": [3, 4, 5], "sampling_params": {"max_new_tokens": 50}}).encode()
                c.send(b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                       b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)  # a full request, never read
            elif kind == 3:
                c.send(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")  # body cut off
            socks.append(c)
        for c in socks:
            c.close()

        # ---- a stream cut mid-way: its request is aborted and its blocks go back ----
        aborted0 = s.metrics()['epmoe_requests_total{outcome="aborted"}']
        body = json.dumps({"input_ids": [7, 8, 9], "stream": True,
                           "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}).encode()
        c = socket.create_connection((host, port), timeout=30)
        c.send(b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
               b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while got.count(b"data: ") < 3:
            chunk = c.recv(4096)
            if not chunk:
                break
            got += chunk
        check(got.startswith(b"HTTP/1.1 200") and got.count(b"data: ") >= 3, "the stream started")
        c.close()
        deadline = time.time() + 30
        while s.metrics()['epmoe_requests_total{outcome="aborted"}'] == aborted0 and time.time() < deadline:
            time.sleep(0.1)
        m = s.metrics()
        check(m['epmoe_requests_total{outcome="aborted"}'] > aborted0,
              "the cut stream's request was aborted")

        # ---- afterwards: alive, idle, no block held, the same bits ----
        check(s.alive(), "the server is still up")
        m = s.wait_idle()
        check(m['epmoe_kv_blocks{state="used"}'] == 0, "no KV block is held (the pool is whole again)")
        st, after = greedy(url)
        check(st == 200 and after == before, "the same request gives the same ids and log-prob bits after it all")
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
