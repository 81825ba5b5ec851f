"""Make PyPI's torchvision wheel importable on the CPU torch build (yardstick venvs only).

PyPI's Linux torchvision wheels are CUDA builds: their C ops (``torchvision._C``) cannot load next to
the CPU torch, and a few modules then register fake kernels for those missing ops unguarded and fail
at import.  vLLM's model files import torchvision's Python transforms only; this rewrites those
registrations in an installed torchvision to apply only when its C ops loaded.

    python tools/vllm_ascend_ut/cpu_torchvision.py VENV_PYTHON
"""
import pathlib
import subprocess
import sys

GUARDED = ('@(torch.library.register_fake if __import__("torchvision.extension").extension._has_ops() '
           'else (lambda *a, **k: (lambda f: f)))(')


def main(python: str) -> None:
    where = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('torchvision').submodule_search_locations[0])"],
                           check=True, capture_output=True, text=True).stdout.strip()
    for path in pathlib.Path(where).rglob("*.py"):
        text = path.read_text()
        if '@torch.library.register_fake("torchvision::' in text:
            path.write_text(text.replace('@torch.library.register_fake(', GUARDED))
            print(f"guarded: {path}")


if __name__ == "__main__":
    main(sys.argv[1])
