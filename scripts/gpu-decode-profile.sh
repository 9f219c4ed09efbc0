#!/usr/bin/env bash
# Where a decode step's time goes (issue 33): Nsight Compute over one eager decode step of the
# synthesized Qwen3-30B-A3B (gpu_model_bench --profile-step 1, graph off, caches left warm as in
# a real step: --cache-control none, clocks alone), at 1 and 8 sequences, LAYERS layers (default
# 2: every layer runs the same kernels, so the per-layer rows hold at any depth). Prints, per
# kernel name, launches, time and DRAM bytes per step and per layer, beside the step's sum; the
# raw CSVs go to $OUT.
#   OUT=/tmp/p bash scripts/gpu-decode-profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
out=${OUT:-/tmp/epmoe-gpu}
mkdir -p "$out"
ncu=$NCU
[[ -n $ncu ]] || { echo "gpu-decode-profile: no ncu" >&2; exit 1; }
layers=${LAYERS:-2}
for b in ${PROFILE_B:-1 8}; do
  timeout 200 "$ncu" --clock-control none --cache-control none --profile-from-start off \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum --kernel-name-base function --csv --print-units base \
    "$GPU_BIN/gpu_model_bench" --layers "$layers" --batches "$b" --prefill 0 --steps 1 --profile-step 1 \
    > "$out/decode_profile_b$b.csv" 2> "$out/decode_profile_b$b.err"
  echo "=== decode step, $b sequence(s), $layers layers (ncu exit $?)"
  python3 - "$out/decode_profile_b$b.csv" "$layers" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
layers = int(sys.argv[2])
try:
    h = next(i for i, r in enumerate(rows) if "Metric Name" in r)
except StopIteration:
    sys.exit("no kernels profiled")
head = rows[h]
c = {n: head.index(n) for n in head}
kern = {}
for r in rows[h + 1:]:
    if len(r) != len(head):
        continue
    k = kern.setdefault(r[c["ID"]], {"name": r[c["Kernel Name"]][:48]})
    try:
        k[r[c["Metric Name"]]] = float(r[c["Metric Value"]].replace(",", ""))
    except ValueError:
        pass
by = {}
for k in kern.values():
    g = by.setdefault(k["name"], [0, 0.0, 0.0])
    g[0] += 1
    g[1] += k.get("gpu__time_duration.sum", 0) / 1e3
    g[2] += k.get("dram__bytes_read.sum", 0) / 1e6
tot_t = sum(g[1] for g in by.values())
tot_b = sum(g[2] for g in by.values())
print(f"| kernel | launches | us per step | us per layer (if per layer) | DRAM MB | share |")
print("|---|---|---|---|---|---|")
for name, (n, t, mb) in sorted(by.items(), key=lambda x: -x[1][1]):
    per_layer = f"{t / layers:.1f}" if n % layers == 0 else "-"
    print(f"| {name} | {n} | {t:.1f} | {per_layer} | {mb:.1f} | {100 * t / tot_t:.1f}% |")
print(f"| all ({len(kern)} launches) | | {tot_t:.1f} | | {tot_b:.1f} | |")
PY
done
