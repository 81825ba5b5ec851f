"""Per-op cost in a long test: what the per-op microbenchmark does not see.

Times ``a + c`` (16x32 floats) in one loop of N ops with the garbage collector on (every op leaves
records the collector walks), and the same op followed by ``torch.npu.memory_allocated()`` (a test
that reads memory after every step applies the allocator's statistics log each time).  One torch
thread, CPU time of the process, microseconds per op.
"""
import argparse
import time

import torch

import _emulation


def per_op(fn, n: int) -> float:
    for _ in range(500):
        fn()
    t = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t) / n * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ops", type=int, default=200_000)
    p.add_argument("--reads", type=int, default=20_000)
    a = p.parse_args()
    torch.set_num_threads(1)
    rt = _emulation.start()
    x, y = torch.randn(16, 32).to("npu"), torch.randn(16, 32).to("npu")

    def add():
        return x + y

    def add_and_read():
        x + y
        torch.npu.memory_allocated()
    print(f"a + c, {a.ops} ops in one loop, collector on : {per_op(add, a.ops):6.1f} us/op "
          f"({len(rt.trace)} trace records)")
    print(f"a + c then memory_allocated(), {a.reads} steps  : {per_op(add_and_read, a.reads):6.1f} us/step")


if __name__ == "__main__":
    main()
