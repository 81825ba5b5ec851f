"""Memory growth per test that compiles a model (issue 16: "near plain torch's").

Runs one pytest process of N parametrised tests, each building a small model and compiling it, and
reads the process's resident memory after every test (``/proc/self/statm``); prints the growth per
test as the slope of a least-squares line over the second half of the run (the first tests warm
caches).  Two runs: with the plugin (NPU tensors, TorchAir's backend, in GE and reduce-overhead
mode) and without it (``-p no:npugraph``, CPU tensors, ``backend="aot_eager"``), in one process each,
one torch thread.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import textwrap

MODEL = """
import torch

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2 + x
"""

NPU_TEST = MODEL + """
import pytest, torch_npu, torchair

@pytest.mark.parametrize("i", range({n}))
def test_compile(npugraph, i):
    config = torchair.CompilerConfig()
    if i % 2:
        config.mode = "reduce-overhead"
    model = Block().npu()
    compiled = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config), fullgraph=True)
    x = torch.randn(4, 32, device="npu")
    assert torch.allclose(compiled(x).cpu(), model(x).cpu(), atol=1e-5)
"""

CPU_TEST = MODEL + """
import pytest

@pytest.mark.parametrize("i", range({n}))
def test_compile(i):
    torch._dynamo.reset()          # the plugin resets Dynamo after each compiling test; do the same here
    model = Block()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = torch.randn(4, 32)
    assert torch.allclose(compiled(x), model(x), atol=1e-5)
"""

CONFTEST = """
import gc, os
import pytest

@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location):
    gc.collect()
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    with open(os.environ["RSS_LOG"], "a") as f:
        f.write(f"{rss}\\n")
"""


def slope(values) -> float:
    """KiB per test: least squares over the second half."""
    ys = values[len(values) // 2:]
    xs = range(len(ys))
    mx, my = sum(xs) / len(ys), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def run(kind: str, n: int) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "test_compile_many.py"), "w") as f:
            f.write(textwrap.dedent((NPU_TEST if kind == "npu" else CPU_TEST).replace("{n}", str(n))))
        with open(os.path.join(tmp, "conftest.py"), "w") as f:
            f.write(CONFTEST)
        log = os.path.join(tmp, "rss.log")
        env = dict(os.environ, RSS_LOG=log, OMP_NUM_THREADS="1")
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", tmp]
        if kind == "cpu":
            args += ["-p", "no:npugraph"]
        subprocess.run(args, cwd=tmp, env=env, check=True, stdout=subprocess.DEVNULL)
        with open(log) as f:
            return [int(line) for line in f]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tests", type=int, default=80)
    a = p.parse_args()
    print(f"resident memory growth per compiling test, {a.tests} tests, slope over the second half")
    for kind, label in (("cpu", "plain torch (aot_eager, CPU)"), ("npu", "pytest-npugraph (TorchAir, npu)")):
        values = run(kind, a.tests)
        print(f"  {label:34s} {slope(values):8.1f} KiB/test   (RSS {values[0] / 1024:.0f} -> {values[-1] / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
