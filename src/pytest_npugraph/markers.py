"""The plugin's markers: their help lines and their validation into a per-test configuration."""
from __future__ import annotations

from ._context import TestConfig
from . import cann
from .chips import CHIPS, lookup
from .hazard import KINDS

MARKERS = {
    "npu_cores": "npu_cores(aicore=N, vector=M): AI Core (cube) and vector core counts of every emulated "
                 "device in the test (vector defaults to 2 x aicore).",
    "npu_chip": "npu_chip(NAME): chip profile (core counts, memory), e.g. Ascend910B3 or Ascend910_9392.",
    "npu_devices": "npu_devices(N): number of emulated NPU devices in the test (default 1).",
    "npu_no_inherit": "npu_no_inherit: processes the test starts do not emulate the NPU (by default a child "
                      "Python process imports the emulated torch_npu with the test's settings).",
    "npu_allow": "npu_allow(KIND, ...): hazards of these kinds are reported but do not fail the test.",
    "npu_cann": "npu_cann(VERSION): the CANN release emulated in the test, e.g. npu_cann('9.0.0') "
                "(HCCL AIV op table, static kernel + core limit).",
}


class MarkerError(ValueError):
    """A malformed marker; the plugin turns it into a usage error naming the test."""


def _positive_int(marker: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise MarkerError(f"@pytest.mark.{marker}: {name} must be a positive int, got {value!r}")
    return value


def _one(item, name):
    marks = list(item.iter_markers(name))
    return marks[0] if marks else None   # the closest marker wins, as with pytest's own markers


def config_for(item, default_chip: str, default_cann: str = cann.DEFAULT) -> TestConfig:
    chip = lookup(default_chip)
    mark = _one(item, "npu_chip")
    if mark is not None:
        if len(mark.args) != 1 or mark.kwargs or not isinstance(mark.args[0], str):
            raise MarkerError(f"@pytest.mark.npu_chip takes one chip name, e.g. npu_chip('Ascend910B3'); "
                              f"got args={mark.args!r} kwargs={mark.kwargs!r}")
        if mark.args[0] not in CHIPS:
            raise MarkerError(f"@pytest.mark.npu_chip: unknown chip {mark.args[0]!r}; known chips: {', '.join(CHIPS)}")
        chip = lookup(mark.args[0])
    mark = _one(item, "npu_cores")
    if mark is not None:
        params = dict(zip(("aicore", "vector"), mark.args))
        unknown = set(mark.kwargs) - {"aicore", "vector"}
        if unknown or len(mark.args) > 2 or set(params) & set(mark.kwargs):
            raise MarkerError("@pytest.mark.npu_cores takes aicore=N and optionally vector=M, "
                              f"got args={mark.args!r} kwargs={mark.kwargs!r}")
        params.update(mark.kwargs)
        if "aicore" not in params:
            raise MarkerError("@pytest.mark.npu_cores needs aicore=N")
        aicore = _positive_int("npu_cores", "aicore", params["aicore"])
        vector = _positive_int("npu_cores", "vector", params.get("vector", 2 * aicore))
        chip = chip.with_cores(aicore, vector)
    devices = 1
    mark = _one(item, "npu_devices")
    if mark is not None:
        if len(mark.args) + len(mark.kwargs) != 1 or set(mark.kwargs) - {"n", "count"}:
            raise MarkerError(f"@pytest.mark.npu_devices takes one positive int, got args={mark.args!r} "
                              f"kwargs={mark.kwargs!r}")
        devices = _positive_int("npu_devices", "the device count", (list(mark.args) + list(mark.kwargs.values()))[0])
    allow = set()
    for mark in item.iter_markers("npu_allow"):
        if mark.kwargs or not mark.args:
            raise MarkerError(f"@pytest.mark.npu_allow takes hazard kinds, e.g. npu_allow('race'); "
                              f"got args={mark.args!r} kwargs={mark.kwargs!r}")
        for kind in mark.args:
            if kind not in KINDS:
                raise MarkerError(f"@pytest.mark.npu_allow: unknown hazard kind {kind!r}; kinds: {', '.join(KINDS)}")
            allow.add(kind)
    version = default_cann
    mark = _one(item, "npu_cann")
    if mark is not None:
        if len(mark.args) != 1 or mark.kwargs or not isinstance(mark.args[0], str):
            raise MarkerError(f"@pytest.mark.npu_cann takes one version string, e.g. npu_cann('8.5.0'); "
                              f"got args={mark.args!r} kwargs={mark.kwargs!r}")
        version = mark.args[0]
        if version not in cann.VERSIONS:
            raise MarkerError(f"@pytest.mark.npu_cann: unknown CANN version {version!r}; known versions: "
                              f"{', '.join(cann.VERSIONS)}")
    return TestConfig(chip=chip, device_count=devices, allow=frozenset(allow), nodeid=item.nodeid, cann=version)
