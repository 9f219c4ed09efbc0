#!/usr/bin/env bash
# Hardware counters of the MoE layer's kernels (Nsight Compute, clocks left alone), at M = 1 and
# M = 4096 of gpu_moe_bench: time, DRAM and tensor-pipe utilisation, occupancy. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
out=${OUT:-/tmp/epmoe-gpu}
mkdir -p "$out"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[[ -n $ncu ]] || { echo "no ncu"; exit 1; }
for m in 1 4096; do
  echo "=== M=$m"
  timeout 100 "$ncu" --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    --kernel-name-base function --kernel-name regex:'route|tc_gemm|plan|combine|router_split' --launch-count 8 \
    --csv --page details --print-units base \
    "$GPU_BIN/gpu_moe_bench" --m $m --iters 1 > "$out/ncu_m$m.csv" 2> "$out/ncu_m$m.err"
  tail -3 "$out/ncu_m$m.err"
  python3 - "$out/ncu_m$m.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
h = next(i for i, r in enumerate(rows) if "Metric Name" in r)
head = rows[h]
c = {n: head.index(n) for n in head}
want = ["Duration", "DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput", "Achieved Occupancy",
        "Registers Per Thread", "Grid Size", "Dynamic Shared Memory Per Block"]
kern = {}
order = []
for r in rows[h + 1:]:
    if len(r) != len(head):
        continue
    key = (r[c["ID"]], r[c["Kernel Name"]][:38])
    if key not in kern:
        kern[key] = {}
        order.append(key)
    if r[c["Metric Name"]] in want:
        kern[key][r[c["Metric Name"]]] = (r[c["Metric Value"]], r[c["Metric Unit"]])
print("| id | kernel | " + " | ".join(want) + " |")
for k in order:
    vals = []
    for w in want:
        v, u = kern[k].get(w, ("", ""))
        if w == "Duration" and u in ("nsecond", "ns"):
            v, u = f"{float(v.replace(',', '')) / 1e3:.1f}", "us"
        vals.append(f"{v} {u}".strip())
    print(f"| {k[0]} | {k[1]} | " + " | ".join(vals) + " |")
PY
done
