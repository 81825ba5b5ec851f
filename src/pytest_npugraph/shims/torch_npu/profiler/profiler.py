"""``torch_npu.profiler.profile``: a context manager that runs the profiled code and follows the
schedule's actions; ``tensorboard_trace_handler`` writes the emulated device timeline."""
from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable, Iterable, Optional

from .experimental_config import _ExperimentalConfig
from .profiler_interface import ProfilerActivity, supported_activities
from .scheduler import ProfilerAction, _default_schedule_fn, _warn

__all__ = ["supported_activities", "analyse", "tensorboard_trace_handler", "profile"]

_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


class _ProfInterface:
    """What the profiler collected: the emulated trace positions of its recorded windows."""

    def __init__(self, activities, experimental_config, **switches):
        self.activities = set(activities) if activities else supported_activities()
        if any(a not in supported_activities() for a in self.activities):
            _warn("Invalid activities, only CPU and NPU are supported, reset it to default.")
            self.activities = supported_activities()
        for name, value in switches.items():
            if not isinstance(value, bool):
                _warn(f"Parameter {name} is of boolean type, reset it to False.")
                value = False
            setattr(self, name, value)
        if experimental_config is None:
            experimental_config = _ExperimentalConfig()
        elif not isinstance(experimental_config, _ExperimentalConfig):
            _warn("Parameter experimental_config is an instance of _ExperimentalConfig, reset it to default.")
            experimental_config = _ExperimentalConfig()
        self.experimental_config = experimental_config
        self.windows = []           # (first trace position, last trace position) of each recorded window
        self._start = None
        self.prof_path = ""
        self.dir_name = None
        self.worker_name = None
        self.trace_id = ""

    @staticmethod
    def _position() -> int:
        from pytest_npugraph.runtime.runtime import peek

        rt = peek()
        return 0 if rt is None else len(rt.trace)

    def start_trace(self):
        if self._start is None:
            self._start = self._position()

    def stop_trace(self):
        if self._start is not None:
            self.windows.append((self._start, self._position()))
            self._start = None

    def analyse(self, async_mode: bool = False, **_):
        """Write the running test's emulated device timeline where the real profiler puts its trace view."""
        from pytest_npugraph.report import timeline
        from pytest_npugraph.runtime.runtime import peek

        if self.dir_name is None:
            return
        worker = self.worker_name or f"{socket.gethostname()}_{os.getpid()}"
        self.prof_path = os.path.join(self.dir_name, f"{worker}_{int(time.time() * 1000)}_ascend_pt")
        out = os.path.join(self.prof_path, "ASCEND_PROFILER_OUTPUT")
        os.makedirs(out, exist_ok=True)
        rt = peek()
        if rt is not None:
            timeline.write(os.path.join(out, "trace_view.json"), rt.trace)


class _KinetoProfile:
    def __init__(self, *, activities: Optional[Iterable[ProfilerActivity]] = None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config: Optional[_ExperimentalConfig] = None,
                 custom_trace_id_callback: Optional[Callable[[], str]] = None):
        self.metadata = {}
        self.prof_if = _ProfInterface(activities, experimental_config, record_shapes=record_shapes,
                                      profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops,
                                      with_modules=with_modules)
        self.custom_trace_id_callback = custom_trace_id_callback

    def start(self):
        self.prof_if.start_trace()

    def stop(self):
        self.prof_if.stop_trace()

    def export_chrome_trace(self, output_path: str):
        from pytest_npugraph.report import timeline
        from pytest_npugraph.runtime.runtime import peek

        rt = peek()
        if rt is not None:
            timeline.write(output_path, rt.trace)

    def add_metadata(self, key: str, value: str):
        if not isinstance(key, str) or not isinstance(value, str):
            _warn("The key and value of metadata must be str, skip it.")
            return
        self.metadata[key] = value

    def add_metadata_json(self, key: str, value: str):
        self.add_metadata(key, value)

    def export_stacks(self, output_path: str, metric: str = "self_cpu_time_total"):
        pass

    def export_memory_timeline(self, output_path: str, device: Optional[str] = None) -> None:
        pass


def tensorboard_trace_handler(dir_name: Optional[str] = None, worker_name: Optional[str] = None,
                              analyse_flag: bool = True, async_mode: bool = False):
    """An ``on_trace_ready`` that writes each saved window's trace under ``dir_name`` (default ``./``)."""
    if not isinstance(analyse_flag, bool):
        _warn("analyse_flag is not bool, set by default.")
        analyse_flag = True
    if not isinstance(async_mode, bool):
        _warn("async_mode is not bool, set by default.")
        async_mode = False
    dir_name = os.path.abspath(dir_name or os.getcwd())

    def handler_fn(prof_inst) -> None:
        prof_inst.prof_if.dir_name, prof_inst.prof_if.worker_name = dir_name, worker_name
        if analyse_flag:
            prof_inst.prof_if.analyse(async_mode=async_mode)
    return handler_fn


class profile(_KinetoProfile):
    """Runs the wrapped code; ``step()`` advances the schedule; ``on_trace_ready(self)`` is called at the
    end of every RECORD_AND_SAVE step and at ``stop()`` inside a recording window."""

    def __init__(self, *, activities: Optional[Iterable[ProfilerActivity]] = None,
                 schedule: Optional[Callable[[int], ProfilerAction]] = None,
                 on_trace_ready: Optional[Callable[..., Any]] = None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config: Optional[_ExperimentalConfig] = None,
                 execution_trace_observer=None, custom_trace_id_callback: Optional[Callable[[], str]] = None,
                 use_cuda: Optional[bool] = None):
        super().__init__(activities=activities, record_shapes=record_shapes, profile_memory=profile_memory,
                         with_stack=with_stack, with_flops=with_flops, with_modules=with_modules,
                         experimental_config=experimental_config, custom_trace_id_callback=custom_trace_id_callback)
        if schedule and callable(schedule):
            self.schedule, self.record_steps = schedule, True
        else:
            if schedule:
                _warn("schedule is not Callable, set by default.")
            self.schedule, self.record_steps = _default_schedule_fn, False
        if on_trace_ready and not callable(on_trace_ready):
            _warn("on_trace_ready is not Callable, set by default.")
            on_trace_ready = None
        if use_cuda is not None:
            _warn("This is npu environment, use_cuda is invalid")
        self.on_trace_ready = on_trace_ready
        self.execution_trace_observer = execution_trace_observer
        self.step_num = 0
        self.current_action = self.schedule(self.step_num)
        self.stopped = False

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc_value, tb):
        self.stop()

    def _transit(self, prev: Optional[ProfilerAction], cur: Optional[ProfilerAction]) -> None:
        """torch's profiler state machine: a window records from its first WARMUP/RECORD step; it is
        saved (``on_trace_ready``) after a RECORD_AND_SAVE step, or at stop while recording."""
        if prev in _RECORDING or prev is ProfilerAction.WARMUP:
            if cur is None or prev is ProfilerAction.RECORD_AND_SAVE or cur is ProfilerAction.NONE:
                self.prof_if.stop_trace()
                if prev in _RECORDING and self.on_trace_ready is not None:
                    self.on_trace_ready(self)
        if cur in _RECORDING or cur is ProfilerAction.WARMUP:
            self.prof_if.start_trace()

    def start(self):
        self.stopped = False
        self._transit(None, self.current_action)
        if self.execution_trace_observer:
            self.execution_trace_observer.start()

    def stop(self):
        if self.stopped:
            return
        self._transit(self.current_action, None)
        self.stopped = True
        if self.execution_trace_observer:
            self.execution_trace_observer.stop()

    def step(self):
        if self.stopped:
            _warn("Profiler is stopped, step takes no effect!")
            return
        prev = self.current_action
        self.step_num += 1
        self.current_action = self.schedule(self.step_num)
        self._transit(prev, self.current_action)

    def set_custom_trace_id_callback(self, callback: Callable[[], str]) -> None:
        self.custom_trace_id_callback = callback

    def get_trace_id(self) -> str:
        return self.custom_trace_id_callback() if self.custom_trace_id_callback else self.prof_if.trace_id

    @classmethod
    def enable_profiler_in_child_thread(cls, record_shapes: bool = False, profile_memory: bool = False,
                                        with_stack: bool = False, with_flops: bool = False,
                                        with_modules: bool = False):
        pass

    @classmethod
    def disable_profiler_in_child_thread(cls):
        pass


def analyse(profiler_path: str, max_process_number: int = 0, export_type=None):
    """Offline parsing of msprof data: there is none under emulation (the trace view is written directly)."""
    if not os.path.isdir(profiler_path):
        _warn(f"Invalid profiler path: {profiler_path}")
