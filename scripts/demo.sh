#!/usr/bin/env bash
# README's demo: install, build, then run the bundled tiny Qwen3-MoE with expert parallelism
# over 4 MPI ranks (each rank holds 2 of the 8 experts), with every backend, and show that the
# generated ids are the same as the single-process run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
model=tests/data/qwen3moe-tiny
prompts=tests/data/demo-prompts.txt
ranks=${RANKS:-4}

echo "== epmoe info"
build/epmoe info --model "$model"
echo
echo "== single process"
build/epmoe generate --model "$model" --prompts-file "$prompts" --max-new-tokens 12 | tee /tmp/epmoe-demo-ref.txt
for backend in none alltoall lowlatency onesided fused; do
  echo
  echo "== mpirun -np $ranks, --moe-a2a-backend $backend"
  mpirun --oversubscribe -np "$ranks" build/epmoe generate --model "$model" --prompts-file "$prompts" \
    --max-new-tokens 12 --moe-a2a-backend "$backend" | tee /tmp/epmoe-demo-$backend.txt
  if cmp -s /tmp/epmoe-demo-ref.txt /tmp/epmoe-demo-$backend.txt; then
    echo "   -> identical to the single-process run"
  else
    echo "   -> DIFFERENT from the single-process run"
    exit 1
  fi
done
