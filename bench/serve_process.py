"""Starts `epmoe serve` for a benchmark and finds its address (the benchmarks' one launcher)."""
import os
import re
import subprocess
import sys
import threading


def start_serve(cmd, timeout=600):
    """Runs cmd (an `epmoe serve ... --port 0` command line, maybe under mpirun); returns (process, url)
    once it prints its address; exits the benchmark if it does not within `timeout` seconds."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    found, url = threading.Event(), []

    def drain():  # (keeps reading, so that the server never blocks on a full pipe)
        for line in proc.stdout:
            m = re.search(rb"listening on (http://[\d.]+:\d+)", line)
            if m and not url:
                url.append(m.group(1).decode())
                found.set()
    threading.Thread(target=drain, daemon=True).start()
    if not found.wait(timeout):
        proc.kill()
        sys.exit("epmoe serve did not start: " + " ".join(cmd))
    return proc, url[0]
