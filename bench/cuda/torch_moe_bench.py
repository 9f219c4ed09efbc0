"""The MoE layer with torch._grouped_mm at the Qwen3-30B-A3B shape, timed like gpu_moe_bench.

Whole layer: router matmul (fp32) -> softmax top-8 with renorm -> sort by expert -> gather ->
grouped GEMM gate+up -> SiLU * up -> grouped GEMM down -> weighted sum per token (index_add_).
bf16 weights and activations, CUDA graph, L2 flushed (512 MB memset) before every replay,
median of the replays. Writes a TSV (M, us) for scripts/gpu-bench-table.py.

    python3 bench/cuda/torch_moe_bench.py [--out FILE.tsv] [--m 1,8,64,...] [--iters N]
"""
import argparse
import statistics

import torch

H, E, K, I = 2048, 128, 8, 768


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--m", default="1,8,64,256,1024,4096")
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    w1 = (torch.rand(E, 2 * I, H, device=dev) * 2 - 1).mul_(0.04).to(torch.bfloat16)  # [gate; up] rows
    w2 = (torch.rand(E, H, I, device=dev) * 2 - 1).mul_(0.06).to(torch.bfloat16)
    wr = (torch.rand(E, H, device=dev) * 2 - 1).mul_(0.04)
    w1t, w2t = w1.transpose(-2, -1), w2.transpose(-2, -1)  # [E, H, 2I], [E, I, H] column-major views
    flush = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    rows = []
    for M in [int(v) for v in args.m.split(",")]:
        x = ((torch.rand(M, H, device=dev) * 2 - 1) * 1.7).to(torch.bfloat16)

        def layer():
            logits = x.float() @ wr.t()
            p = torch.softmax(logits, dim=-1)
            topw, topi = torch.topk(p, K, dim=-1)
            topw = topw / topw.sum(-1, keepdim=True)
            flat = topi.reshape(-1)
            order = torch.argsort(flat, stable=True)
            counts = torch.zeros(E, dtype=torch.int32, device=dev).scatter_add_(
                0, flat, torch.ones_like(flat, dtype=torch.int32))
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            tok = order // K
            xs = x[tok]
            gu = torch._grouped_mm(xs, w1t, offs=offs)
            hh = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
            out = torch._grouped_mm(hh, w2t, offs=offs)
            out = out.float() * topw.reshape(-1)[order].unsqueeze(1)
            return torch.zeros(M, H, device=dev).index_add_(0, tok, out)

        try:
            layer()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(f"M={M}: torch._grouped_mm layer failed: {e}", flush=True)
            continue
        mode = "graph"
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    layer()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                layer()
            run = g.replay
        except Exception as e:  # noqa: BLE001
            print(f"M={M}: graph capture failed ({e}); timing eager")
            mode = "eager"
            run = layer
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        us = []
        for i in range(args.iters + 3):
            flush.fill_(i & 0xFF)
            a.record()
            run()
            b.record()
            b.synchronize()
            if i >= 3:
                us.append(a.elapsed_time(b) * 1e3)
        med = statistics.median(us)
        rows.append((M, med, mode))
        print(f"torch._grouped_mm layer M={M}: {med:.1f} us ({mode})", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("M\tus\tmode\n")
            for M, t, mode in rows:
                f.write(f"{M}\t{t:.2f}\t{mode}\n")


if __name__ == "__main__":
    main()
