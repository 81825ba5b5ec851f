"""Per-op cost of the emulation at the shapes unit tests use.

For each op (mm, add, a view, advanced indexing, an in-place op, a torch_npu custom op) times the
same call on plain CPU tensors and on emulated npu tensors, in one process with one torch thread
on both sides, and prints the median overhead per call in microseconds (goal: median <= 25 us).
"""
import argparse
import statistics
import time

import torch

import _emulation


def per_call(fn, calls: int, rounds: int) -> float:
    """Median over ``rounds`` of the mean time of ``calls`` back-to-back calls (seconds)."""
    fn()
    samples = []
    for _ in range(rounds):
        t = time.process_time()
        for _ in range(calls):
            fn()
        samples.append((time.process_time() - t) / calls)
    return statistics.median(samples)


def cases(device):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 32, generator=g).to(device)
    b = torch.randn(32, 16, generator=g).to(device)
    c = torch.randn(16, 32, generator=g).to(device)
    idx = torch.tensor([0, 3, 5, 7]).to(device)
    gamma = torch.ones(32).to(device)
    out = {
        "mm": lambda: a @ b,
        "add": lambda: a + c,
        "view": lambda: a.view(32, 16),
        "slice": lambda: a[:, :8],
        "index": lambda: a[idx],
        "add_": lambda: c.add_(1.0),
        "sum": lambda: a.sum(-1),
    }
    if device == "npu":
        import torch_npu
        out["npu_rms_norm"] = lambda: torch_npu.npu_rms_norm(a, gamma)
    else:
        def rms_norm():
            rstd = torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6)
            return a * rstd * gamma, rstd
        out["npu_rms_norm"] = rms_norm
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    torch.set_num_threads(1)
    rt = _emulation.start()
    cpu, npu = cases("cpu"), cases("npu")
    overheads = []
    print(f"per-op cost, one torch thread, median of {a.rounds} rounds of {a.calls} calls")
    print(f"  {'op':14s} {'cpu us':>9s} {'npu us':>9s} {'overhead us':>12s} {'ratio':>7s}")
    for name in cpu:
        c = per_call(cpu[name], a.calls, a.rounds)
        n = per_call(npu[name], a.calls, a.rounds)
        overheads.append((n - c) * 1e6)
        print(f"  {name:14s} {c * 1e6:9.1f} {n * 1e6:9.1f} {(n - c) * 1e6:12.1f} {n / c:7.1f}")
    print(f"  median overhead: {statistics.median(overheads):.1f} us/op  (goal <= 25 us)"
          f"  trace records: {len(rt.trace)}")


if __name__ == "__main__":
    main()
