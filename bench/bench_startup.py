"""pytest start-up cost of the plugin: 200 trivial tests with the plugin vs ``-p no:npugraph``.

Runs each configuration alternately in fresh processes and compares medians (goal: ratio <= 1.05).
"""
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(args, cwd) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *args],
                   cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main(rounds: int = 7) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        lines = [f"def test_{i}():\n    assert {i} + 1 > {i}\n" for i in range(200)]
        Path(tmp, "test_trivial.py").write_text("\n".join(lines))
        Path(tmp, "pytest.ini").write_text("[pytest]\n")
        run([], tmp)  # warm the file-system cache
        plugin, plain = [], []
        for _ in range(rounds):
            plugin.append(run([], tmp))
            plain.append(run(["-p", "no:npugraph"], tmp))
    a, b = statistics.median(plugin), statistics.median(plain)
    print(f"200 trivial tests, median of {rounds} runs")
    print(f"  with pytest-npugraph : {a * 1e3:7.1f} ms")
    print(f"  -p no:npugraph       : {b * 1e3:7.1f} ms")
    print(f"  ratio                : {a / b:7.3f}  (goal <= 1.05)")


if __name__ == "__main__":
    main()
