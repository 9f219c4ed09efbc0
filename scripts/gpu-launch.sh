#!/usr/bin/env bash
# Starts N processes of a command, one per GPU, as one epmoe GPU group (src/comm/nccl_group.h):
#   EPMOE_RANK=r EPMOE_WORLD_SIZE=N EPMOE_NCCL_ID_FILE=<file rank 0 writes the NCCL id to>
# (next to it, each rank's status file <id file>.rank<r>.status names the peer that does not answer
# when a wait times out; all are removed at the end)
# Rank 0's output is passed through as is; other ranks' lines are prefixed with [rank r].
# When one process fails, the others are ended (by their pids) and its exit code is returned.
#
#   scripts/gpu-launch.sh 2 build-cuda/epmoe score --device cuda --model DIR --ids 1,2,3 --out l.st
set -u
n=${1:?usage: gpu-launch.sh N command [args...]}
shift
export NCCL_NVLS_ENABLE=0  # NVLink multicast can take a shared host's GPUs down (device README)
export EPMOE_WORLD_SIZE=$n
EPMOE_NCCL_ID_FILE=$(mktemp -u "${TMPDIR:-/tmp}/epmoe-nccl-id.XXXXXX")
export EPMOE_NCCL_ID_FILE
pids=()
for ((r = 0; r < n; r++)); do
  if ((r == 0)); then
    EPMOE_RANK=$r "$@" &
  else
    EPMOE_RANK=$r "$@" > >(sed -u "s/^/[rank $r] /") 2> >(sed -u "s/^/[rank $r] /" >&2) &
  fi
  pids+=($!)
done
rc=0
left=("${pids[@]}")
while ((${#left[@]})); do
  wait -n -p finished "${left[@]}"
  code=$?
  rest=()
  for p in "${left[@]}"; do [[ $p != "$finished" ]] && rest+=("$p"); done
  left=("${rest[@]+"${rest[@]}"}")
  if ((code != 0 && rc == 0)); then
    rc=$code
    echo "gpu-launch: process $finished exited with $code; ending the others" >&2
    for p in "${left[@]+"${left[@]}"}"; do kill "$p" 2>/dev/null; done
  fi
done
rm -f "$EPMOE_NCCL_ID_FILE" "$EPMOE_NCCL_ID_FILE.tmp" "$EPMOE_NCCL_ID_FILE".rank*.status "$EPMOE_NCCL_ID_FILE".rank*.status.tmp
exit $rc
