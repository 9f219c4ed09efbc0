#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan) into build-fuzz/ and runs each for
# SECONDS (default 60). New inputs go to build-fuzz/corpus/<target>/ (fuzz/corpus/<target>/ holds
# the committed seeds); a crash leaves its input in build-fuzz/artifacts/ and fails the script.
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]      targets: safetensors config tokenizer tokenizer_json
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then targets=(safetensors config tokenizer tokenizer_json); fi

bash scripts/install-deps.sh
cmake -S fuzz -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build build-fuzz -j2 >/dev/null

mkdir -p build-fuzz/artifacts
# Each libFuzzer process is single-threaded: the targets run side by side, one per core, each for
# the full SECONDS (CI's two cores: half the wall time, the same executions per target).
cores=$(nproc)
run_target() {
  local t=$1 log="build-fuzz/fuzz_$1.log" rc
  mkdir -p "build-fuzz/corpus/$t"
  # -timeout: an input that takes longer than 10 s is a finding (a hang), not a slow run.
  # -rss_limit_mb: a hostile file must not make a parser allocate gigabytes.
  # -max_len: room for the larger seeds (tokenizer.json) while keeping mutations quick.
  "build-fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -print_final_stats=1 -dict="fuzz/dict/$t.dict" -artifact_prefix="build-fuzz/artifacts/$t-" \
    "build-fuzz/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1 && rc=0 || rc=$?
  echo "$rc" >"build-fuzz/fuzz_$t.rc"
}
rm -f build-fuzz/fuzz_*.rc  # a previous run's status must not stand in for this one's
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= cores)); do wait -n || true; done
  run_target "$t" &
done
wait
failed=0
for t in "${targets[@]}"; do
  log="build-fuzz/fuzz_$t.log"
  if [[ $(cat "build-fuzz/fuzz_$t.rc" 2>/dev/null) != 0 ]]; then
    tail -n 60 "$log" >&2
    echo "fuzz: $t FAILED (input saved under build-fuzz/artifacts/; log $log)" >&2
    failed=1
    continue
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  corpus=$(find "build-fuzz/corpus/$t" -type f | wc -l)
  echo "fuzz: $t: $execs executions in $seconds s, no finding (corpus $corpus new inputs)"
done
exit $failed
