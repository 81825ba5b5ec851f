"""``torch_npu.profiler.dynamic_profile``: profiling switched on by a JSON file a running job watches.
Under emulation no file is watched: ``init``/``start`` take the path, ``step`` counts steps."""
import os

__all__ = ["init", "step", "start", "set_state"]

_state = {"path": None, "step": 0, "config": None}


def init(path: str):
    if not isinstance(path, str) or not os.path.isdir(path):
        from .scheduler import _warn

        _warn(f"The path '{path}' is invalid, and profiler will not be enabled.")
        return
    _state["path"] = os.path.abspath(path)


def step():
    _state["step"] += 1


def start(config_path: str = None):
    _state["config"] = config_path


def set_state(state_step: dict):
    if isinstance(state_step, dict) and "step" in state_step:
        _state["step"] = int(state_step["step"])
