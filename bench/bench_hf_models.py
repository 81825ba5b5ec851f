"""Eager overhead of the emulation on real model code: the forward of each tests/thirdparty model
(Hugging Face Llama, Qwen2, Qwen2-MoE, DeepSeek-V3 from small random configs) on the emulated npu vs
the same model on plain CPU torch, one torch thread on both sides, in one process.  Prints both
times and their ratio per model (``--hidden``/``--layers``/``--tokens`` scale the models up).
"""
import argparse
import os
import statistics
import sys
import time

import torch

import _emulation

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def timed(fn, repeats):
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        samples.append(time.process_time() - t)
    return statistics.median(samples)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--models", default="llama,qwen2,qwen2_moe,deepseek_v3")
    a = p.parse_args()
    torch.set_num_threads(1)
    rt = _emulation.start()
    from tests.thirdparty.models import build, prompt

    ids = prompt(a.batch, a.tokens)
    size = dict(hidden_size=a.hidden, intermediate_size=2 * a.hidden, num_hidden_layers=a.layers)
    print(f"HF model forward, batch={a.batch} tokens={a.tokens} hidden={a.hidden} layers={a.layers}, 1 thread")
    for name in a.models.split(","):
        model = build(name, **size)
        with torch.no_grad():
            cpu = timed(lambda: model(ids), a.repeats)
            expected = model(ids).logits
            model.npu()
            ids_npu = ids.npu()
            n0 = len(rt.trace)
            npu = timed(lambda: model(ids_npu), a.repeats)
            per_call = (len(rt.trace) - n0) / (a.repeats + 1)
            got = model(ids_npu).logits.cpu()
        assert torch.allclose(expected, got, atol=1e-5), f"{name}: emulated logits differ from CPU torch"
        print(f"  {name:12s} cpu {cpu * 1e3:8.2f} ms   npu {npu * 1e3:8.2f} ms   ratio {npu / cpu:6.2f}x"
              f"   ({per_call:.0f} trace records/call)")


if __name__ == "__main__":
    main()
