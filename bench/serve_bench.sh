#!/usr/bin/env bash
# serve_bench.sh: epmoe serve vs llama-server on the same weights under the same closed-loop load.
#
# usage: bench/serve_bench.sh [-h] MODEL_DIR GGUF OUT_DIR
#
#   MODEL_DIR  Hugging Face checkpoint for epmoe (e.g. from `epmoe synth ... --out DIR`, with the
#              tokenizer files copied in)
#   GGUF       the same weights for llama-server (converted without rounding, e.g. bf16)
#   OUT_DIR    results: OUT_DIR/<label>/cC.json (serve_bench.py run), cC.txt (its output),
#              server-cC.log (the server's log), server-cmd.txt; OUT_DIR/table.md at the end
#
# One server at a time listens on a loopback port: both on one 2-core machine would fight for the
# cores and for memory bandwidth, which is what decode speed follows. Before every level the read
# bandwidth of the machine is recorded (BW_PROBE, prints "read X GB/s"): on shared VMs it moves
# between runs (seen: ~35 and ~52 GB/s), so a ratio is only meaningful next to the two bandwidths.
#
# ORDER=interleaved (default): for each level, each server is started, warmed up (one request),
# driven, and stopped, with the order of the servers alternating from level to level (ABBA...), so
# slow drifts of the machine (bandwidth, a neighbour's build) fall on both sides. A fresh server
# per level also means no state carries over from one level to the next. ORDER=sequential: each
# server once, all levels in one go (faster: one model load per server).
#
# Environment (defaults in brackets):
#   EPMOE        epmoe binary [this repo's build/epmoe]; started as
#                $EPMOE serve --model MODEL_DIR --port PORT --threads THREADS $EPMOE_ARGS
#                (epmoe computes in fp32 by default; EPMOE_ARGS="--compute bf16" rounds activations
#                to bf16 as llama.cpp does with bf16 weights, if the CPU has AVX512-BF16)
#   LLAMA_BIN    directory with llama-server [/tmp/llama.cpp/build/bin]; started as
#                llama-server -m GGUF -t THREADS --host 127.0.0.1 --port LLAMA_PORT -np NP -c CTX $LLAMA_ARGS
#   SERVERS      which servers, in order ["epmoe llama"]
#   ORDER        interleaved | sequential [interleaved]
#   LEVELS       concurrency levels ["1 8 32 128"]
#   REQS         requests per level: one number, or one per level [max(2C, 16)]
#   MAX_TOKENS   output tokens per request [32]; PMIN / PMAX prompt length range [64 / 256];
#   VOCAB_MAX    prompt ids are below this [151000]; TEMP temperature [0]
#   CHECK_ALONE  K: after each level replay K of its requests alone and compare tokens and fp32
#                log-prob bits with their results under load [0: off; the load requests then ask
#                for no logprobs, which would cost llama-server a whole-vocabulary sort per token]
#   THREADS      compute threads of each server [2] (of each rank, with RANKS)
#   RANKS        epmoe's ranks [1]: more run it as `mpirun -np RANKS --oversubscribe --bind-to none
#                $EPMOE serve ...` (data-parallel attention unless EPMOE_ARGS says --dp-attention
#                off; add --moe-a2a-backend NAME to EPMOE_ARGS, the default being none)
#   NP           llama-server slots [8]; CTX its total context [NP x (PMAX + MAX_TOKENS + 16)
#                rounded up to 256 per slot, as llama.cpp pads each slot's share anyway]
#   PORT         epmoe's loopback port [18480]; LLAMA_PORT llama-server's [PORT + 1]: one port
#                each, because a server that closed connections leaves them in TIME_WAIT on its
#                port, and a listener of another program may be refused that port for a minute
#                (epmoe's cpp-httplib sets SO_REUSEPORT but not SO_REUSEADDR; seen: epmoe started
#                right after llama-server on one port failed with "cannot listen")
#   START_TIMEOUT seconds to wait for /health [600]
#   LLAMA_BODY   JSON merged into each request to llama-server [{"cache_prompt": false}]: the
#                alone replays resend prompts seen under load, and llama-server would otherwise
#                pick the slot holding that prompt and reuse its KV instead of computing alone
#                (the load prompts are random and never share a prefix, so throughput is unchanged)
#   EPMOE_BODY   JSON merged into each request to epmoe [{}]
#   EPMOE_ARGS, LLAMA_ARGS   extra server arguments; BENCH_ARGS extra `serve_bench.py run` arguments
#   BW_PROBE     bandwidth probe [/tmp/bw_probe; build: gcc -O3 -march=native -fopenmp
#                bw_probe.c]; empty or missing: not recorded
#   TIMEOUT      seconds per request [600]; LEVEL_DEADLINE seconds per level [1200];
#                DEADLINE seconds for one server's call of serve_bench.py [3600]
#   QUIET_WAIT   before each level wait up to this many seconds for the machine to be quiet (CPU
#                busy < QUIET_BUSY [0.3] over 2 s; the server is idle then, so this is someone
#                else's work, e.g. a build) [180]; the busy fraction found is recorded either way
#   PY           python with aiohttp [/usr/bin/python3]
#
# Example (a 4-layer Qwen3-30B-A3B-shaped model, both servers, identical check on 8 per level):
#   build/epmoe synth --like qwen3-30b-a3b --layers 4 --dtype bf16 --out /tmp/synth4   # + tokenizer
#   CHECK_ALONE=8 bench/serve_bench.sh /tmp/synth4 /tmp/synth4-bf16.gguf /tmp/serve-bench/run1
#   /usr/bin/python3 bench/serve_bench.py table /tmp/serve-bench/run1 --ratio epmoe llama-server
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
if [[ ${1:-} == -h || ${1:-} == --help ]]; then usage; exit 0; fi
if (($# != 3)); then usage >&2; exit 2; fi
model_dir=$1 gguf=$2 out=$3

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
PY=${PY:-/usr/bin/python3}
EPMOE=${EPMOE:-$repo/build/epmoe}
LLAMA_BIN=${LLAMA_BIN:-/tmp/llama.cpp/build/bin}
SERVERS=${SERVERS:-"epmoe llama"}
ORDER=${ORDER:-interleaved}
LEVELS=${LEVELS:-"1 8 32 128"}
REQS=${REQS:-}
MAX_TOKENS=${MAX_TOKENS:-32} PMIN=${PMIN:-64} PMAX=${PMAX:-256} VOCAB_MAX=${VOCAB_MAX:-151000}
TEMP=${TEMP:-0} CHECK_ALONE=${CHECK_ALONE:-0}
THREADS=${THREADS:-2} NP=${NP:-8} RANKS=${RANKS:-1}
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
slot=$(( (PMAX + MAX_TOKENS + 16 + 255) / 256 * 256 ))
CTX=${CTX:-$((NP * slot))}
PORT=${PORT:-18480} LLAMA_PORT=${LLAMA_PORT:-$((PORT + 1))} START_TIMEOUT=${START_TIMEOUT:-600}
LLAMA_BODY=${LLAMA_BODY:-'{"cache_prompt": false}'}
EPMOE_BODY=${EPMOE_BODY:-'{}'}
EPMOE_ARGS=${EPMOE_ARGS:-} LLAMA_ARGS=${LLAMA_ARGS:-} BENCH_ARGS=${BENCH_ARGS:-}
BW_PROBE=${BW_PROBE-/tmp/bw_probe}
QUIET_WAIT=${QUIET_WAIT:-180} QUIET_BUSY=${QUIET_BUSY:-0.3}
TIMEOUT=${TIMEOUT:-600} LEVEL_DEADLINE=${LEVEL_DEADLINE:-1200} DEADLINE=${DEADLINE:-3600}

for s in $SERVERS; do
  case $s in
    epmoe) [[ -x $EPMOE ]] || { echo "no epmoe binary at $EPMOE (EPMOE=...)" >&2; exit 2; }
           [[ -d $model_dir ]] || { echo "no model dir $model_dir" >&2; exit 2; } ;;
    llama) [[ -x $LLAMA_BIN/llama-server ]] || { echo "no $LLAMA_BIN/llama-server (LLAMA_BIN=...)" >&2; exit 2; }
           [[ -f $gguf ]] || { echo "no GGUF $gguf" >&2; exit 2; } ;;
    *) echo "unknown server '$s' in SERVERS (epmoe, llama)" >&2; exit 2 ;;
  esac
done
if [[ -n $BW_PROBE && ! -x $BW_PROBE ]]; then
  echo "note: no bandwidth probe at '$BW_PROBE'; bandwidth not recorded" >&2; BW_PROBE=
fi
mkdir -p "$out"

label_of() { [[ $1 == epmoe ]] && echo epmoe || echo llama-server; }

port_of() { [[ $1 == epmoe ]] && echo "$PORT" || echo "$LLAMA_PORT"; }

server_cmd() {  # the command line of server $1, into the array `cmd`
  local port
  port=$(port_of "$1")
  if [[ $1 == epmoe ]]; then
    # shellcheck disable=SC2206
    cmd=("$EPMOE" serve --model "$model_dir" --port "$port" --threads "$THREADS" $EPMOE_ARGS)
    if ((RANKS > 1)); then cmd=(mpirun -np "$RANKS" --oversubscribe --bind-to none "${cmd[@]}"); fi
  else
    # llama-server as a CPU user would run it: -np slots share -c; continuous batching, flash
    # attention auto, f16 KV, n_batch 2048 / n_ubatch 512 are its defaults.
    # shellcheck disable=SC2206
    cmd=("$LLAMA_BIN/llama-server" -m "$gguf" -t "$THREADS" --host 127.0.0.1 --port "$port"
         -np "$NP" -c "$CTX" $LLAMA_ARGS)
  fi
}

spid='' bpid=''
stop_server() {
  [[ -n $spid ]] || return 0
  kill -TERM "$spid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$spid" 2>/dev/null || break; sleep 0.5; done
  kill -KILL "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  spid=
}
stop_all() { [[ -n $bpid ]] && kill "$bpid" 2>/dev/null; stop_server; }
trap stop_all EXIT
# the load generator runs in the background and is waited for, so that a signal is acted on at
# once (bash runs traps only after a foreground child ends)
trap 'stop_all; exit 130' INT TERM

health() { curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$1/health" 2>/dev/null || true; }

start_server() {  # $1 server, $2 log file; waits until GET /health answers 200; one retry
  start_once "$@" && return 0
  echo "retrying in 65 s (a port held by TIME_WAIT connections frees within 60 s)" >&2
  sleep 65
  start_once "$@"
}

start_once() {
  local port
  port=$(port_of "$1")
  if [[ $(health "$port") != 000 ]]; then
    echo "something already answers on port $port; set PORT=... / LLAMA_PORT=..." >&2; exit 1
  fi
  server_cmd "$1"
  echo "${cmd[*]}" > "$out/$(label_of "$1")/server-cmd.txt"
  local t0=$SECONDS
  "${cmd[@]}" > "$2" 2>&1 &
  spid=$!
  while [[ $(health "$port") != 200 ]]; do
    if ! kill -0 "$spid" 2>/dev/null; then
      echo "$(label_of "$1") exited while starting; last lines of $2:" >&2; tail -5 "$2" >&2; spid=; return 1
    fi
    if ((SECONDS - t0 > START_TIMEOUT)); then
      echo "$(label_of "$1") not healthy after $START_TIMEOUT s; see $2" >&2; stop_server; return 1
    fi
    sleep 1
  done
  echo "$(date +%T) $(label_of "$1") up (pid $spid) after $((SECONDS - t0)) s"
}

run_bench() {  # $1 server, $2 levels (comma list), $3 requests (comma list or ""), $4 out json
  local lab body
  lab=$(label_of "$1")
  if [[ $1 == epmoe ]]; then body=$EPMOE_BODY; else body=$LLAMA_BODY; fi
  local a=(--url "http://127.0.0.1:$(port_of "$1")" --label "$lab" --levels "$2" --max-tokens "$MAX_TOKENS"
           --prompt-len-min "$PMIN" --prompt-len-max "$PMAX" --vocab-max "$VOCAB_MAX"
           --temperature "$TEMP" --check-alone "$CHECK_ALONE" --extra-body "$body"
           --quiet-wait "$QUIET_WAIT" --quiet-busy "$QUIET_BUSY"
           --timeout "$TIMEOUT" --level-deadline "$LEVEL_DEADLINE" --deadline "$DEADLINE"
           --meta "$("$PY" -c 'import json, sys; print(json.dumps({"server_cmd": sys.argv[1]}))' "${cmd[*]}")"
           --out "$4")
  [[ -n $3 ]] && a+=(--requests "$3")
  [[ -n $BW_PROBE ]] && a+=(--bw-probe "$BW_PROBE")
  [[ -n $spid ]] && a+=(--server-pid "$spid")  # to tell the server's CPU from a neighbour's
  # shellcheck disable=SC2086
  "$PY" "$here/serve_bench.py" run "${a[@]}" $BENCH_ARGS > "${4%.json}.txt" 2>&1 &
  bpid=$!
  wait "$bpid" || echo "($lab: some requests failed; see ${4%.json}.txt)" >&2
  bpid=
  grep -E '^(====|machine|CPU during|completed|   [0-9]+ x|requests/s|output tok|TTFT|ITL|E2E|alone)' "${4%.json}.txt" || true
}

read -r -a levels <<< "$LEVELS"
read -r -a reqs <<< "$REQS"
for s in $SERVERS; do mkdir -p "$out/$(label_of "$s")"; done
echo "$(date +%T) serve_bench: servers [$SERVERS], order $ORDER, levels [$LEVELS], max_tokens $MAX_TOKENS," \
     "prompts $PMIN-$PMAX, check-alone $CHECK_ALONE, threads $THREADS, out $out"

if [[ $ORDER == sequential ]]; then
  rq=
  if ((${#reqs[@]})); then rq=$(IFS=,; echo "${reqs[*]}"); fi
  for s in $SERVERS; do
    lab=$(label_of "$s")
    start_server "$s" "$out/$lab/server.log" || continue
    run_bench "$s" "$(IFS=,; echo "${levels[*]}")" "$rq" "$out/$lab/all.json"
    stop_server
  done
elif [[ $ORDER == interleaved ]]; then
  read -r -a order <<< "$SERVERS"
  for i in "${!levels[@]}"; do
    c=${levels[$i]}
    rq=
    if ((${#reqs[@]} == 1)); then rq=${reqs[0]}; elif ((${#reqs[@]} > i)); then rq=${reqs[$i]}; fi
    for s in "${order[@]}"; do
      lab=$(label_of "$s")
      start_server "$s" "$out/$lab/server-c$c.log" || continue
      run_bench "$s" "$c" "$rq" "$out/$lab/c$c.json"
      stop_server
    done
    # reverse the order for the next level (ABBA): drift over time falls on both servers
    for ((a = 0, b = ${#order[@]} - 1; a < b; a++, b--)); do t=${order[a]}; order[a]=${order[b]}; order[b]=$t; done
  done
else
  echo "ORDER must be interleaved or sequential" >&2; exit 2
fi

"$PY" "$here/serve_bench.py" table "$out" | tee "$out/table.md"
