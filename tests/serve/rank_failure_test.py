"""A rank that dies or hangs ends `epmoe serve` with a message naming it and a non-zero exit,
never a hang (tests/serve, ctest serve.rank_failure).

Two servers of 2 ranks under mpirun, idle and then busy: rank 1 is stopped (SIGSTOP: a hang that
no socket notices) while a request runs. The group's timeout (--comm-timeout 5; the idle heartbeat
is 1 s) must end every process within a bound, with rank 0 naming rank 1; the waiting client gets
an error or a closed connection, not an eternal wait.
"""
import json
import os
import signal
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_harness as h  # noqa: E402

check = h.Checks()


def run(busy):
    s = h.Server(os.path.join(h.DATA, "qwen3moe-tiny"), ranks=2,
                 args=["--comm-timeout", "5", "--heartbeat", "1", "--moe-a2a-backend", "alltoall"])
    s.start()
    what = "busy" if busy else "idle"
    client = {}
    try:
        pid = s.rank_pid(1)
        check(pid is not None, "%s: found rank 1" % what)
        if busy:
            def long_request():
                body = {"input_ids": [3, 4, 5], "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
                req = urllib.request.Request(s.url + "/generate", data=json.dumps(body).encode(), method="POST")
                try:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        client["result"] = "answered %d" % r.status
                except Exception as e:  # the server went away: what a client should see
                    client["result"] = "error: %s" % type(e).__name__
            t = threading.Thread(target=long_request)
            t.start()
            time.sleep(0.3)
        t0 = time.time()
        os.kill(pid, signal.SIGSTOP)
        try:
            rc = s.proc.wait(60)
        except Exception:
            rc = None
        took = time.time() - t0

        def names_rank_1():
            log = "".join(s.log)
            return "rank 1" in log or "rank(s) 1" in log or "ranks 1" in log

        # (The harness's reader thread may still hold the last lines the server printed before it
        # exited: it gets up to 5 s more to drain them -- the stopped rank keeps the pipe open.)
        deadline = time.time() + 5
        while not names_rank_1() and time.time() < deadline:
            time.sleep(0.1)
        check(rc is not None and rc != 0, "%s: the server exited non-zero (%s) %.1f s after rank 1 hung" % (what, rc, took))
        check(names_rank_1(),
              "%s: the message names rank 1: %s" % (what, [l.strip() for l in s.log if "rank" in l][-2:]))
        if busy:
            t.join(70)
            check(not t.is_alive() and client.get("result", "").startswith("error"),
                  "busy: the waiting client saw the server go (%s)" % client.get("result"))
    finally:
        s.kill()


def main():
    run(busy=False)
    run(busy=True)
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
