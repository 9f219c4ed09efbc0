#!/usr/bin/env bash
# The GPU tests (issues 9 and 10), on a machine with NVIDIA GPUs, from the binaries that
# scripts/gpu-package.sh put in .gpu/ (or GPU_BIN=DIR). CI compiles them (scripts/build-cuda.sh) and
# runs them under ctest (label gpu), where without a GPU they report skipped.
#   1 GPU:  the GoogleTest binary gpu_test: kernels, and every fixture against transformers' goldens
#           in bf16 and f32 (the ctest entries gpu.gemm, gpu.routing, gpu.experts, gpu.goldens);
#           epmoe score / generate --device cuda
#           gpu_ipc_test (ctest gpu.ipc.2proc): the backends that write into peers' memory, as two
#           processes (on one GPU too)
#   2 GPUs: gpu_ep_test (ctest gpu.ep.2gpu): expert parallelism, bit-identical to one GPU for every
#           backend, every injected fault caught;
#           epmoe generate --device cuda on 2 processes (gpu-launch.sh, and mpirun where installed:
#           the NCCL id through MPI); epmoe check --device cuda on every
#           fixture (must pass) and with an injected double reduce (must fail, naming it)
# Logs go to $OUT (or /tmp/epmoe-gpu). Exit status 0 when everything passed.
# EP_ONLY=1: the expert-parallel part (2 GPUs) and the single-GPU references it compares with only,
# on three fixtures (the dense 1-GPU suite and the other fixtures' rollouts are skipped).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
out=${OUT:-/tmp/epmoe-gpu}
mkdir -p "$out"
export EPMOE_COMM_TIMEOUT=${EPMOE_COMM_TIMEOUT:-30}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
status=0
step() {  # step NAME TIMEOUT command...
  local name=$1 limit=$2
  shift 2
  echo "=== $name"
  timeout "$limit" stdbuf -oL -eL "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$out/$name.log"
  echo "=== $name: exit $rc"
  ((rc == 0)) || status=1
}
fx=tests/data/qwen3moe-tiny
ids=$(python3 -c "
from safetensors.numpy import load_file
print(','.join(str(int(v)) for v in load_file('$fx/golden.safetensors')['seq0.all_ids']))" 2>/dev/null || echo 5,17,42,99,3)
ep_only=${EP_ONLY:-0}
((ep_only)) || step gpu_test 150 "$GPU_BIN/gpu_test" --gtest_color=no
# The NVLink backends as two processes (on two GPUs, or both on one): bit-identical to one process,
# every fault caught with the CPU's diagnosis, a stopped peer named (issue 19).
step gpu_ipc_test 300 "$GPU_BIN/gpu_ipc_test"
step cli_score 60 "$GPU_BIN/epmoe" score --device cuda --model $fx --ids "$ids" --out "$out/score.safetensors"
step cli_generate 60 "$GPU_BIN/epmoe" generate --device cuda --model $fx --prompt-ids "$ids" --max-new-tokens 8
step cli_generate_f32 60 "$GPU_BIN/epmoe" generate --device cuda --compute f32 --model $fx --prompt-ids "$ids" \
  --max-new-tokens 8
# Sampling and log-probs on the GPU (issue 15): a seeded rollout's log-probs are the bits `score
# --temperature` computes teacher-forced (scripts/rollout-check.py), in both compute modes.
printf '5,17,42,99,3\n7,7,200,13\n1,2,3,4,5,6,7,8,9,10,11\n' > "$out/rollout_prompts.txt"
rollout_args="--model $fx --prompts-file $out/rollout_prompts.txt --max-new-tokens 10 --ignore-eos --temperature 0.9 \
  --top-p 0.95 --n 2 --seed 3 --json --logprobs 2"
for c in bf16 f32; do
  step "rollout_1gpu_$c" 120 bash -c "$GPU_BIN/epmoe generate --device cuda --compute $c $rollout_args \
    > $out/rollout_1gpu_$c.jsonl && python3 scripts/rollout-check.py $out/rollout_1gpu_$c.jsonl 0.9 \
    $GPU_BIN/epmoe score --device cuda --compute $c --model $fx"
done
# Without masks or top-N the tokens are drawn on the device (model/cuda/sampling.cu): the log-probs
# are still the teacher-forced score bits, on 1 GPU and on 2.
draw_args="--model $fx --prompts-file $out/rollout_prompts.txt --max-new-tokens 10 --ignore-eos --temperature 0.9 \
  --n 2 --seed 3 --json --logprobs"
for c in bf16 f32; do
  step "rollout_device_draw_$c" 120 bash -c "$GPU_BIN/epmoe generate --device cuda --compute $c $draw_args \
    > $out/rollout_draw_$c.jsonl && python3 scripts/rollout-check.py $out/rollout_draw_$c.jsonl 0.9 \
    $GPU_BIN/epmoe score --device cuda --compute $c --model $fx"
done
# A top-N with the device's draws (top_rows, issue 33): the same JSON lines -- tokens, log-probs,
# top_logprobs' ids and bits -- as the host's draws of the same rollout (--check-numerics keeps the
# draws on the host), sampled (2 samples) and greedy (one: --n 2 needs T > 0).
for tn in "0.9 2" "0 1"; do
  read -r t n <<< "$tn"
  a="${draw_args/--temperature 0.9/--temperature $t}"
  a="${a/--n 2/--n $n} 5"
  step "rollout_device_top_n_t$t" 120 bash -c "$GPU_BIN/epmoe generate --device cuda $a \
    > $out/rollout_topn_dev_t$t.jsonl && $GPU_BIN/epmoe generate --device cuda $a --check-numerics \
    > $out/rollout_topn_host_t$t.jsonl && grep -q top_logprobs $out/rollout_topn_dev_t$t.jsonl && \
    cmp <(grep '^{' $out/rollout_topn_dev_t$t.jsonl) <(grep '^{' $out/rollout_topn_host_t$t.jsonl)"
done
# Every fixture, both kinds of draw (device: no masks; host: top-p and top-N), bf16.
((ep_only)) || for name in qwen3moe-tiny-mixed-bf16 qwen3moe-tiny-v5 qwen2moe-tiny glm4moe-tiny mixtral-tiny; do
  for kind in draw host; do
    if [[ $kind == draw ]]; then a=${draw_args//$fx/tests\/data\/$name}; else a=${rollout_args//$fx/tests\/data\/$name}; fi
    step "rollout_${name}_$kind" 120 bash -c "$GPU_BIN/epmoe generate --device cuda $a \
      > $out/rollout_${name}_$kind.jsonl && python3 scripts/rollout-check.py $out/rollout_${name}_$kind.jsonl 0.9 \
      $GPU_BIN/epmoe score --device cuda --model tests/data/$name"
  done
done
if ((ngpu >= 2)); then
  # (onesided under --max-batch-tokens: the promised bound, windows sized once, no host agreement)
  for b in alltoall onesided; do
    scripts/gpu-launch.sh 2 "$GPU_BIN/epmoe" generate --device cuda $draw_args --moe-a2a-backend $b \
      --max-batch-tokens 5 > "$out/rollout_draw_2gpu_$b.jsonl" 2> "$out/rollout_draw_2gpu_$b.log"
    if [[ -s $out/rollout_draw_bf16.jsonl ]] && cmp -s "$out/rollout_draw_2gpu_$b.jsonl" "$out/rollout_draw_bf16.jsonl"; then
      echo "=== rollout device draws 2 GPUs ($b, 5 tokens a step) == 1 GPU: ok"
    else echo "=== rollout device draws 2 GPUs ($b) differ from 1 GPU: FAIL"; status=1; fi
  done
fi
# The scheduler's limits (chunked prefill of 7 tokens a step, 2 sequences in flight) change no bit.
"$GPU_BIN/epmoe" generate --device cuda $rollout_args --max-batch-tokens 7 --max-running-requests 2 \
  > "$out/rollout_1gpu_chunked.jsonl" 2> "$out/rollout_1gpu_chunked.log"
if cmp -s "$out/rollout_1gpu_chunked.jsonl" "$out/rollout_1gpu_bf16.jsonl" && [[ -s $out/rollout_1gpu_bf16.jsonl ]]; then
  echo "=== rollout 1 GPU chunked (7 tokens a step, 2 in flight) == unlimited: ok"
else echo "=== rollout 1 GPU chunked differs from unlimited: FAIL"; status=1; fi
# The paged KV cache: a pool of 96 positions (requests wait for blocks; the 2 samples of a prompt
# fork its blocks), blocks of 1 token, no prefix reuse: the same lines.
for kv in "--kv-cache-tokens 96 --kv-block-size 4" "--kv-block-size 1 --no-prefix-cache"; do
  "$GPU_BIN/epmoe" generate --device cuda $rollout_args $kv --max-running-requests 2 \
    > "$out/rollout_1gpu_kv.jsonl" 2> "$out/rollout_1gpu_kv.log"
  if [[ -s $out/rollout_1gpu_bf16.jsonl ]] &&
     cmp -s <(sed 's/"cached_tokens":[0-9]*,//' "$out/rollout_1gpu_kv.jsonl") \
            <(sed 's/"cached_tokens":[0-9]*,//' "$out/rollout_1gpu_bf16.jsonl"); then
    echo "=== rollout 1 GPU $kv == default pool: ok"
  else echo "=== rollout 1 GPU $kv differs from the default pool: FAIL"; tail -3 "$out/rollout_1gpu_kv.log"; status=1; fi
done
if ((ngpu >= 2)); then
  # The same rollout on 2 GPUs with every backend: the same lines, bit for bit.
  for b in none alltoall lowlatency onesided fused; do
    scripts/gpu-launch.sh 2 "$GPU_BIN/epmoe" generate --device cuda $rollout_args --moe-a2a-backend $b \
      > "$out/rollout_2gpu_$b.jsonl" 2> "$out/rollout_2gpu_$b.log"
    if cmp -s "$out/rollout_2gpu_$b.jsonl" "$out/rollout_1gpu_bf16.jsonl" && [[ -s $out/rollout_1gpu_bf16.jsonl ]]; then
      echo "=== rollout 2 GPUs $b == 1 GPU: ok"
    else echo "=== rollout 2 GPUs $b differs from 1 GPU: FAIL"; status=1; fi
  done
  # The NCCL group bootstrapped through MPI (issue 35: rank, size, local GPU and the NCCL id from
  # mpirun, no id file): the same lines as 1 GPU. Needs mpirun on the machine (not packaged).
  if command -v mpirun > /dev/null; then
    mpirun -np 2 --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x EPMOE_COMM_TIMEOUT \
      "$GPU_BIN/epmoe" generate --device cuda $rollout_args --moe-a2a-backend alltoall \
      > "$out/rollout_2gpu_mpirun.jsonl" 2> "$out/rollout_2gpu_mpirun.log"
    if cmp -s "$out/rollout_2gpu_mpirun.jsonl" "$out/rollout_1gpu_bf16.jsonl" && [[ -s $out/rollout_1gpu_bf16.jsonl ]]; then
      echo "=== rollout 2 GPUs under mpirun (NCCL id through MPI) == 1 GPU: ok"
    else echo "=== rollout 2 GPUs under mpirun differs from 1 GPU: FAIL"; tail -5 "$out/rollout_2gpu_mpirun.log"; status=1; fi
  else
    echo "=== no mpirun on this machine: the MPI bootstrap of NCCL is not tested here"
  fi
  step gpu_ep_test 240 scripts/gpu-launch.sh 2 "$GPU_BIN/gpu_ep_test" --gtest_color=no
  printf '%s\n' "$ids" "${ids%,*}" "${ids#*,}" > "$out/prompts.txt"
  for b in none alltoall lowlatency onesided fused; do
    step "cli_generate_2gpu_$b" 90 scripts/gpu-launch.sh 2 "$GPU_BIN/epmoe" generate --device cuda \
      --moe-a2a-backend $b --model $fx --prompts-file "$out/prompts.txt" --max-new-tokens 8
  done
  step cli_generate_1gpu_ref 60 "$GPU_BIN/epmoe" generate --device cuda --model $fx --prompts-file "$out/prompts.txt" \
    --max-new-tokens 8
  # Greedy ids of 2 GPUs (every backend) == 1 GPU.
  ref=$(grep -E '^[0-9,]+$' "$out/cli_generate_1gpu_ref.log")
  for b in none alltoall lowlatency onesided fused; do
    got=$(grep -E '^[0-9,]+$' "$out/cli_generate_2gpu_$b.log")
    if [[ -n $ref && $got == "$ref" ]]; then echo "generate 2 GPUs $b == 1 GPU: ok"
    else echo "generate 2 GPUs $b differs from 1 GPU: FAIL"; status=1; fi
  done
  # epmoe check on GPUs: every fixture, both compute modes; redundant experts and a capacity of
  # 3 tokens per round (several lowlatency rounds) on the first.
  fixtures="qwen3moe-tiny qwen3moe-tiny-mixed-bf16 qwen3moe-tiny-v5 qwen2moe-tiny glm4moe-tiny mixtral-tiny \
            deepseek-v2-lite-tiny deepseek-v2-tiny deepseek-v3-tiny glm4moe-lite-tiny qwen3moe-fp8-tiny deepseek-v3-fp8-tiny"
  ((ep_only)) && fixtures="qwen3moe-tiny deepseek-v2-tiny deepseek-v3-fp8-tiny"
  for name in $fixtures; do
    for c in bf16 f32; do
      step "check_2gpu_${name}_$c" 120 scripts/gpu-launch.sh 2 "$GPU_BIN/epmoe" check --device cuda --compute $c \
        --model tests/data/$name --json "$out/check_2gpu_${name}_$c.json"
    done
  done
  step check_2gpu_redundant_cap3 120 scripts/gpu-launch.sh 2 "$GPU_BIN/epmoe" check --device cuda --model $fx \
    --ep-redundant-experts 2 --max-dispatch-tokens-per-rank 3
  # --combine fast (alltoall, onesided): passes within the documented tolerance.
  step check_2gpu_combine_fast 120 scripts/gpu-launch.sh 2 "$GPU_BIN/epmoe" check --device cuda --model $fx \
    --combine fast --moe-a2a-backend alltoall,onesided
  # Every injected bug class must be caught by every backend it applies to, with the CPU's diagnosis
  # (tests/check/check_test.cc): exit 1, each affected backend fails with its verdict, the others
  # (drop-overflow exists only in the bounded lowlatency) pass.
  for fv in "double-reduce:reduced twice" "skip-reduce:not reduced" "replica-per-rank:replica counted twice" \
            "wrong-combine-ids:rows of another token" "drop-overflow:slot lost"; do
    f=${fv%%:*} verdict=${fv#*:}
    echo "=== check_2gpu_inject_$f"
    timeout 180 scripts/gpu-launch.sh 2 "$GPU_BIN/epmoe" check --device cuda --model $fx --ep-redundant-experts 2 \
      --inject "$f" --json "$out/check_2gpu_inject_$f.json" > "$out/check_2gpu_inject_$f.log" 2>&1
    rc=$?
    tail -n 8 "$out/check_2gpu_inject_$f.log"
    if ((rc == 1)) && python3 - "$out/check_2gpu_inject_$f.json" "$f" "$verdict" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); fault, verdict = sys.argv[2], sys.argv[3]
ok = len(j["backends"]) == 5
for b in j["backends"]:
    affected = fault != "drop-overflow" or b["backend"] == "lowlatency"
    good = (not b["pass"] and b["audit"]["verdict"].startswith(verdict)) if affected else b["pass"]
    print(f'  {b["backend"]:<11} {"fails" if not b["pass"] else "passes"}: {b["audit"]["verdict"]}')
    ok &= good
sys.exit(0 if ok else 1)
PY
    then echo "=== check_2gpu_inject_$f: caught by every backend it applies to (exit 1)"
    else echo "=== check_2gpu_inject_$f: NOT caught as it should be (exit $rc)"; status=1; fi
  done
  # A rank that hangs in the middle of a generation (the test-only hook of comm/test_fault.h, as
  # tests/cli/rank_faults_test.cc uses it on CPUs) is named by the other rank within the group's
  # timeout (10 s here), and the group ends with exit 1; a rank that dies ends the group at once.
  # A rank that never joins (started 30 s late) is named by the other within --comm-timeout while
  # the group is being created (ncclCommInitRank has no deadline of its own).
  echo "=== rank_late_is_named"
  printf '#!/usr/bin/env bash\n[[ $EPMOE_RANK == 1 ]] && sleep 30\nexec "$@"\n' > "$out/late_rank1.sh"
  chmod +x "$out/late_rank1.sh"
  start=$SECONDS
  timeout 60 scripts/gpu-launch.sh 2 "$out/late_rank1.sh" "$GPU_BIN/epmoe" generate --device cuda --comm-timeout 5 \
    --model $fx --prompt-ids 5,17,42 --max-new-tokens 4 > "$out/rank_late.log" 2>&1
  rc=$?
  tail -n 3 "$out/rank_late.log" | cut -c1-400
  if ((rc == 1)) && grep -q "rank 1 has not joined" "$out/rank_late.log"; then
    echo "=== rank_late_is_named: ok (exit 1 after $((SECONDS - start)) s)"
  else echo "=== rank_late_is_named: FAIL (exit $rc after $((SECONDS - start)) s)"; status=1; fi
  for action in hang kill hang-onesided; do
    echo "=== rank_${action}_is_named"
    start=$SECONDS
    backend=alltoall
    [[ $action == hang-onesided ]] && backend=onesided
    EPMOE_TEST_FAULT=${action%-onesided}:1:40 timeout 60 scripts/gpu-launch.sh 2 "$GPU_BIN/epmoe" generate \
      --comm-timeout 10 --device cuda --model $fx --prompts-file "$out/prompts.txt" --max-new-tokens 64 --ignore-eos \
      --moe-a2a-backend $backend > "$out/rank_$action.log" 2>&1
    rc=$?
    pkill -9 -f "$GPU_BIN/epmoe" 2>/dev/null
    tail -n 4 "$out/rank_$action.log" | cut -c1-400
    # hang: rank 0 names rank 1 and aborts (exit 1). kill: the launcher sees rank 1 die and ends the
    # group with its code (137); either way, no hang.
    if { [[ $action == hang* ]] && ((rc == 1)) && grep -q "rank 1 does not answer" "$out/rank_$action.log"; } ||
       { [[ $action == kill ]] && ((rc == 137)) && grep -q "exited with 137" "$out/rank_$action.log"; }; then
      echo "=== rank_${action}_is_named: ok (exit $rc after $((SECONDS - start)) s)"
    else echo "=== rank_${action}_is_named: FAIL (exit $rc after $((SECONDS - start)) s)"; status=1; fi
  done
  # onesided's waits are on the device (flags written over NVLink, no NCCL call): a peer that stops
  # after the buffers were mapped is named within the timeout (5 s here) by the other rank's
  # device-side deadline; a peer that is killed ends the group through the launcher at once
  # (gpu_ep_bench's fault drill).
  for how in hang kill; do
    echo "=== onesided_peer_${how}_is_named"
    start=$SECONDS
    EPMOE_COMM_TIMEOUT=5 timeout 60 scripts/gpu-launch.sh 2 "$GPU_BIN/gpu_ep_bench" --t 128 --stop-rank 1 \
      --stop-how $how > "$out/onesided_peer_$how.log" 2>&1
    rc=$?
    pkill -9 -f "$GPU_BIN/gpu_ep_bench" 2>/dev/null
    tail -n 4 "$out/onesided_peer_$how.log" | cut -c1-400
    if { [[ $how == hang ]] && ((rc == 1)) && grep -q "rank 1 does not answer" "$out/onesided_peer_$how.log"; } ||
       { [[ $how == kill ]] && ((rc == 137)) && grep -q "exited with 137" "$out/onesided_peer_$how.log"; }; then
      echo "=== onesided_peer_${how}_is_named: ok (exit $rc after $((SECONDS - start)) s)"
    else echo "=== onesided_peer_${how}_is_named: FAIL (exit $rc after $((SECONDS - start)) s)"; status=1; fi
  done
else
  echo "only $ngpu GPU(s): the 2-GPU tests did not run"
fi
exit $status
