"""Starts and stops `epmoe serve` for the HTTP tests (loopback only, bounded in time).

Used two ways:
  * imported by the Python tests: `with Server(model, ranks=3, args=[...]) as s: s.url`;
  * as a launcher for a client in another language:
      serve_harness.py [--ranks R] [--model DIR|text] [--serve-arg=ARG ...] -- node client.mjs
    starts the server, runs the client with EPMOE_URL (and EPMOE_MODEL_NAME) in its environment,
    stops the server, and exits with the client's status (or 1 if the server did not stop cleanly).

The server listens on a free port (--port 0) and prints it; the harness reads it from stderr.
`text_model()` makes (once per work folder) a tiny random Qwen3-MoE with the fixture tokenizer's
3000-token vocabulary, so that text goes in and text comes out.
"""
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.environ.get("EPMOE_TEST_DATA", os.path.join(HERE, "..", "data"))
EPMOE = os.environ.get("EPMOE_BINARY", os.path.join(HERE, "..", "..", "build", "epmoe"))
WORK = os.environ.get("EPMOE_SERVE_WORK", "/tmp/epmoe-serve-tests")
# On a GPU machine: EPMOE_SERVE_DEVICE=cuda runs the servers with --device cuda, several ranks
# through scripts/gpu-launch.sh (one process per GPU) instead of mpirun.
DEVICE = os.environ.get("EPMOE_SERVE_DEVICE", "cpu")
GPU_LAUNCH = os.path.join(HERE, "..", "..", "scripts", "gpu-launch.sh")
START_TIMEOUT = 120
STOP_TIMEOUT = 60


def synth_once(out, cfg, *args, tokenizer=None):
    """A random checkpoint of config `cfg` (a dict) in the folder `out`, made once per work folder.

    Tests that start at once (ctest -j) may each find it missing: each writes its own config file
    and synthesizes into its own folder, then renames that into place (the first rename wins, the
    others' copies are removed), so no test reads a half-written model or config.
    """
    if os.path.exists(os.path.join(out, "config.json")):
        return out
    os.makedirs(WORK, exist_ok=True)
    tmp = out + ".tmp%d" % os.getpid()
    cfg_path = tmp + ".config.json"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    subprocess.run([EPMOE, "synth", "--like", cfg_path, "--dtype", "f32", *args, "--out", tmp], check=True,
                   stdout=subprocess.DEVNULL)
    os.remove(cfg_path)
    if tokenizer:
        shutil.copy(tokenizer, os.path.join(tmp, "tokenizer.json"))
    try:
        os.rename(tmp, out)
    except OSError:  # another test made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def text_model():
    """A tiny random Qwen3-MoE (vocabulary 3000, eos 2 = <|im_end|>) with tokenizer.json."""
    cfg = json.load(open(os.path.join(DATA, "qwen3moe-tiny", "config.json")))
    cfg["vocab_size"] = 3000
    cfg["eos_token_id"] = 2
    return synth_once(os.path.join(WORK, "text_model"), cfg,
                      tokenizer=os.path.join(DATA, "bpe-tokenizer", "tokenizer.json"))


def second_weights(model):
    """The same architecture with other random weights (for update_weights_from_disk)."""
    tok = os.path.join(model, "tokenizer.json")
    return synth_once(os.path.join(WORK, os.path.basename(model.rstrip("/")) + "_v2"),
                      json.load(open(os.path.join(model, "config.json"))), "--seed", "7",
                      tokenizer=tok if os.path.exists(tok) else None)


class Checks:
    """The verdicts of a script test: one line per check, and the exit status at the end."""

    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            self.failures.append(what)

    def status(self):
        if self.failures:
            print("%d check(s) failed" % len(self.failures))
            return 1
        print("all checks passed")
        return 0


class Server:
    def __init__(self, model=None, ranks=1, args=(), api_key=None):
        self.model = model or text_model()
        self.ranks = ranks
        self.args = list(args)
        self.api_key = api_key
        self.proc = None
        self.url = None
        self.log = []

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        if exc[0] is not None:  # the client failed: what the server said is half of the story
            sys.stderr.write("epmoe serve's last lines (%s):\n%s" % (
                "still running" if self.alive() else "exited with %s" % self.proc.returncode, "".join(self.log[-40:])))
        self.stop(check=exc[0] is None)

    def start(self):
        cmd = [EPMOE, "serve", "--model", self.model, "--port", "0"] + self.args
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        if DEVICE == "cuda":
            cmd += ["--device", "cuda"]
            if self.ranks > 1:
                cmd = ["bash", GPU_LAUNCH, str(self.ranks)] + cmd
        elif self.ranks > 1:
            cmd = ["mpirun", "--oversubscribe", "-np", str(self.ranks)] + cmd + ["--threads", "1"]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        if DEVICE != "cuda" and self.ranks > 1:
            # Open MPI's session directories in a folder of this server's own: concurrent mpiruns
            # sharing $TMPDIR/ompi.<host>.<uid>/ race on its removal (mpi_session_base in
            # tests/common/run.h says how). Open MPI 4 reads orte_tmpdir_base, 5 prte_tmpdir_base.
            session = tempfile.mkdtemp(prefix="epmoe-ompi-")
            atexit.register(shutil.rmtree, session, True)
            env.update(OMPI_MCA_orte_tmpdir_base=session, PRTE_MCA_prte_tmpdir_base=session)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        found = threading.Event()

        def drain():
            for raw in self.proc.stdout:
                line = raw.decode("utf-8", "replace")
                self.log.append(line)
                m = re.search(r"listening on (http://[\d.]+:\d+)", line)
                if m:
                    self.url = m.group(1)
                    found.set()

        threading.Thread(target=drain, daemon=True).start()
        deadline = time.time() + START_TIMEOUT
        while not found.wait(0.2):
            if self.proc.poll() is not None or time.time() > deadline:
                self.kill()
                raise RuntimeError("epmoe serve did not start:\n" + "".join(self.log))

    def headers(self):
        return {"Authorization": "Bearer " + self.api_key} if self.api_key else {}

    def get(self, path):
        req = urllib.request.Request(self.url + path, headers=self.headers())
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.read().decode()

    def post(self, path, body):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers=dict(self.headers(), **{"Content-Type": "application/json"}))
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read().decode())

    def metrics(self):
        """The Prometheus text as {name or name{labels without model}: value}."""
        out = {}
        for line in self.get("/metrics").splitlines():
            if not line or line.startswith("#"):
                continue
            key, value = line.rsplit(" ", 1)
            key = re.sub(r'model="[^"]*",?', "", key).replace("{}", "")
            out[key] = float(value)
        return out

    def wait_idle(self, timeout=30):
        """Until no sequence runs, no request waits and no KV block is held; the metrics then."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if m["epmoe_running_sequences"] == 0 and m["epmoe_queue_requests"] == 0 and \
                    m['epmoe_kv_blocks{state="used"}'] == 0:
                return m
            if time.time() > deadline:
                raise AssertionError("the server did not become idle: %s" % m)
            time.sleep(0.1)

    def rank_pid(self, rank):
        """The pid of rank `rank` (a child of mpirun or gpu-launch.sh); the launcher's for 1 rank."""
        if self.ranks == 1:
            return self.proc.pid
        marks = [b"OMPI_COMM_WORLD_RANK=%d" % rank, b"EPMOE_RANK=%d" % rank]
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                stat = open("/proc/%s/stat" % pid).read()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                env = open("/proc/%s/environ" % pid, "rb").read().split(b"\0")
            except OSError:
                continue
            if ppid == self.proc.pid and any(m in env for m in marks):
                return int(pid)
        return None

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, check=True):
        """SIGTERM; the server (every rank) must exit 0 within STOP_TIMEOUT."""
        if not self.proc or self.proc.poll() is not None:
            if check and self.proc and self.proc.returncode != 0:
                raise AssertionError("epmoe serve exited with %s:\n%s" % (self.proc.returncode, "".join(self.log)))
            return
        # Under mpirun the signal goes to rank 0, which tells every rank to stop (mpirun itself
        # reports a job it had to signal as failed).
        os.kill(self.rank_pid(0) or self.proc.pid, signal.SIGTERM)
        try:
            rc = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("epmoe serve did not stop within %d s:\n%s" % (STOP_TIMEOUT, "".join(self.log)))
        if check and rc != 0:
            raise AssertionError("epmoe serve exited with %d:\n%s" % (rc, "".join(self.log)))


def main(argv):
    ranks, model, serve_args = 1, None, []
    if "--" not in argv:
        sys.exit("usage: serve_harness.py [--ranks R] [--model DIR] [--serve-arg=ARG ...] -- CLIENT ARGS...")
    i = 0
    while argv[i] != "--":
        if argv[i] == "--ranks":
            ranks = int(argv[i + 1])
            i += 2
        elif argv[i] == "--model":
            model = argv[i + 1]
            i += 2
        elif argv[i].startswith("--serve-arg="):
            serve_args.append(argv[i].split("=", 1)[1])
            i += 1
        else:
            sys.exit("serve_harness.py: unknown option " + argv[i])
    client = argv[i + 1:]
    with Server(model, ranks, serve_args) as s:
        env = dict(os.environ, EPMOE_URL=s.url, EPMOE_MODEL_NAME=os.path.basename(s.model.rstrip("/")))
        rc = subprocess.run(client, env=env, timeout=600).returncode
        if rc != 0:
            sys.stderr.write("".join(s.log[-40:]))
        if not s.alive():
            sys.stderr.write("the server died during the client's run:\n" + "".join(s.log))
            return 1
        s.wait_idle()  # the client's requests (aborted ones too) have given their KV blocks back
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
