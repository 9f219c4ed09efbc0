#!/usr/bin/env bash
# Hardware counters of the MoE layer's kernels (Nsight Compute, clocks left alone, caches flushed
# before each kernel) at M = 1, 1024 and 4096 of gpu_moe_bench: time, DRAM read bandwidth, the
# tensor pipe's utilisation (the HMMA pipe: mma.sync and wgmma both count there on sm_90), SM
# throughput, warps active. Logs and the raw CSV in $OUT; a Markdown table per M on stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
out=${OUT:-/tmp/epmoe-gpu}
mkdir -p "$out"
ncu=$NCU
[[ -n $ncu ]] || { echo "no ncu"; exit 1; }
metrics=gpu__time_duration.sum,dram__bytes_read.sum.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
for m in ${PROFILE_M:-1 1024 4096}; do
  echo "=== M=$m"
  # One layer (--iters 1 after the warm-up): the kernels of the first timed replay.
  timeout 120 "$ncu" --clock-control none --metrics "$metrics" --kernel-name-base function \
    --kernel-name regex:'route|gemm|gmma|plan|combine|router' --launch-skip 0 --launch-count 8 \
    --csv --print-units base "$GPU_BIN/gpu_moe_bench" --precision bf16 --m $m --iters 1 \
    > "$out/ncu_m$m.csv" 2> "$out/ncu_m$m.err"
  tail -2 "$out/ncu_m$m.err"
  python3 - "$out/ncu_m$m.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
h = next(i for i, r in enumerate(rows) if "Metric Name" in r)
head = rows[h]
c = {n: head.index(n) for n in head}
cols = [("gpu__time_duration.sum", "us", 1e-3), ("dram__bytes_read.sum.per_second", "DRAM read TB/s", 1e-12),
        ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM %", 1),
        ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe %", 1),
        ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM %", 1),
        ("sm__warps_active.avg.pct_of_peak_sustained_active", "warps active %", 1)]
kern, order = {}, []
for r in rows[h + 1:]:
    if len(r) != len(head):
        continue
    key = (r[c["ID"]], r[c["Kernel Name"]][:34])
    if key not in kern:
        kern[key] = {}
        order.append(key)
    try:
        kern[key][r[c["Metric Name"]]] = float(r[c["Metric Value"]].replace(",", ""))
    except ValueError:
        pass
print("| id | kernel | " + " | ".join(t for _, t, _ in cols) + " |")
print("|---|---|" + "---|" * len(cols))
for k in order:
    vals = [f"{kern[k][m] * s:.3g}" if m in kern[k] else "-" for m, _, s in cols]
    print(f"| {k[0]} | {k[1]} | " + " | ".join(vals) + " |")
PY
done
