"""Merges gpu_moe_bench's TSV and torch_moe_bench.py's TSV into the table of docs/gpu.md.

    python3 scripts/gpu-bench-table.py ours.tsv torch.tsv
"""
import csv
import sys


def read(path):
    with open(path) as f:
        return {int(r["M"]): r for r in csv.DictReader(f, delimiter="\t")}


ours, torch = read(sys.argv[1]), read(sys.argv[2]) if len(sys.argv) > 2 else {}
print("| M | epmoe us | floor us | epmoe / floor | torch._grouped_mm us | epmoe / torch | bytes | FLOPs | bound |")
print("|---|---|---|---|---|---|---|---|---|")
for M in sorted(ours):
    r = ours[M]
    us, fl = float(r["us"]), float(r["floor_us"])
    t = float(torch[M]["us"]) if M in torch else float("nan")
    bound = "memory" if float(r["bytes"]) / 4.3e12 >= float(r["flops"]) / 790e12 else "compute"
    print(f"| {M} | {us:.1f} | {fl:.1f} | {us / fl:.2f} | {t:.1f} | {us / t:.2f} | {float(r['bytes']):.3g} | "
          f"{float(r['flops']):.3g} | {bound} |")
