"""The MoE layer beside sglang's Triton fused MoE, from one GPU call (docs/gpu.md, issue 18).

    python3 scripts/gpu-side-by-side.py moe_bench.tsv sglang_anchor.json

moe_bench.tsv: gpu_moe_bench --out (epmoe's whole layer: router, top-k, plan, gate+up+SwiGLU,
down, combine, one CUDA graph; and each stage alone). sglang_anchor.json: the anchor's bench.py
(../shared/anchors/sglang_fused_moe; its tuned config: two GEMMs, SiLU and the sum over k, one
graph -- the router, top-k and moe_align_block_size are not timed). Both flush L2 by reading
512 MiB before every replay and report medians.

"GEMMs only" compares like with like: the two expert GEMMs, each timed alone in its own graph
(epmoe: gate+up with SwiGLU fused, down; sglang: gemm1, gemm2 -- its SiLU is a third kernel).
"""
import csv
import json
import sys


def main():
    ours = {int(r["M"]): r for r in csv.DictReader(open(sys.argv[1]), delimiter="\t")}
    peer = {r["M"]: r for r in json.load(open(sys.argv[2]))["rows"]}
    print("| M | floor us | epmoe us | sglang us | epmoe / sglang | epmoe / floor | sglang / floor | "
          "GEMMs only: epmoe us | sglang us | epmoe / sglang |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in sorted(ours):
        if m not in peer:
            continue
        o, p = ours[m], peer[m]["tuned"]
        us, fl, pu = float(o["us"]), float(o["floor_us"]), p["layer"]["median_us"]
        og = float(o["gemm1_us"]) + float(o["gemm2_us"])
        pg = p["stages_us"]["gemm1"] + p["stages_us"]["gemm2"]
        print(f"| {m} | {fl:.1f} | {us:.1f} | {pu:.1f} | {us / pu:.2f} | {us / fl:.2f} | {pu / fl:.2f} | "
              f"{og:.1f} | {pg:.1f} | {og / pg:.2f} |")


if __name__ == "__main__":
    main()
