"""Compiled modes against plain CPU ``torch.compile(backend="aot_eager")`` on a small HF Llama (2 layers,
hidden 64, 2 x 16 tokens): per call (median) and first call (the compile) of eager on npu, TorchAir GE
(max-autotune), TorchAir reduce-overhead (aclgraph replay) and npugraph_ex, one torch thread, CPU time,
one process.  Goals (issue 26): GE <= 1.5x per call, reduce-overhead and npugraph_ex <= 1.1x per call,
first call <= 1.2x in every mode.  Values are checked against plain CPU torch.  Per call is the
smallest of ``--rounds`` medians (the machine may be loaded); ``--ge-op-by-op`` runs GE graphs op by
op every call (no plan: compiler/ge_plan.py), the path before plans, for comparison.
"""
import argparse
import os
import statistics
import sys
import time

import torch

import _emulation

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

GOALS = {"eager": None, "ge": 1.5, "reduce-overhead": 1.1, "npugraph_ex": 1.1}


def timed_calls(fn, repeats, rounds=1):
    """(first call, smallest of ``rounds`` medians of ``repeats`` calls) in CPU seconds."""
    t = time.process_time()
    fn()
    first = time.process_time() - t
    medians = []
    for _ in range(rounds):
        samples = []
        for _ in range(repeats):
            t = time.process_time()
            fn()
            samples.append(time.process_time() - t)
        medians.append(statistics.median(samples))
    return first, min(medians)


def backend(mode):
    import torchair

    if mode == "npugraph_ex":
        return "npugraph_ex"
    config = torchair.CompilerConfig()
    config.mode = "max-autotune" if mode == "ge" else "reduce-overhead"
    return torchair.get_npu_backend(compiler_config=config)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", default="eager,ge,reduce-overhead,npugraph_ex")
    p.add_argument("--ge-op-by-op", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    _emulation.start()
    from tests.thirdparty.models import build, prompt

    if a.ge_op_by_op:
        from pytest_npugraph.compiler import ge_plan

        ge_plan.ENABLED = False

    ids = prompt(2, 16)
    model = build("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2).eval()
    with torch.no_grad():
        expected = model(ids).logits
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", dynamic=False)
        ref_first, ref_call = timed_calls(lambda: compiled(ids), a.repeats, a.rounds)
        print(f"HF Llama 2 layers, hidden 64, 2 x 16 tokens, 1 thread; aot_eager on CPU: "
              f"per call {ref_call * 1e3:.2f} ms, first call {ref_first * 1e3:.1f} ms")
        model.npu()
        ids_npu = ids.npu()
        for mode in a.modes.split(","):
            torch._dynamo.reset()
            run = model if mode == "eager" else torch.compile(model, backend=backend(mode), dynamic=False)
            first, call = timed_calls(lambda: run(ids_npu), a.repeats, a.rounds)
            got = run(ids_npu).logits.cpu()
            assert torch.allclose(expected, got, atol=1e-5), f"{mode}: logits differ from CPU torch"
            goal = GOALS[mode]
            goals = "" if goal is None else f"   (goals: per call <= {goal}x, first call <= 1.2x)"
            print(f"  {mode:16s} per call {call * 1e3:8.2f} ms  {call / ref_call:6.2f}x"
                  f"   first call {first * 1e3:8.1f} ms  {first / ref_first:5.2f}x{goals}")


if __name__ == "__main__":
    main()
