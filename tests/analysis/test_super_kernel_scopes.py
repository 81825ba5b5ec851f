"""The super-kernel analysis on hand-built traces: a scope opened on one device does not swallow the
kernels another device (another rank of ``npugraph.run_ranks``) issues while it is open."""
from pytest_npugraph import trace as T
from pytest_npugraph.analysis import super_kernel

from .tracebuild import Build

EARLY = T.OpCores(kind="AIV", vector=48, early_start=True)


def two_ranks():
    b = Build("rank0")
    b.stream("rank1", device=1)
    b.alloc("a0", stream="rank0")
    b.alloc("a1", stream="rank1", device=1)
    return b


def scope(b, what, stream):
    kind = {"super_kernel_begin": T.SuperKernelBegin, "super_kernel_end": T.SuperKernelEnd}[what]
    return b.marker(kind, stream, name="decode", options="")


def test_scope_on_one_device_does_not_cover_another_devices_kernels():
    b = two_ranks()
    scope(b, "super_kernel_begin", "rank0")
    b.kernel("rank1", writes="a1", op="aten::mul", cores=EARLY)     # rank 1: no scope open on device 1
    b.kernel("rank1", reads="a1", op="aten::add")
    scope(b, "super_kernel_end", "rank0")
    found = super_kernel.find(b.trace)
    assert [(h.severity, "outside any SuperKernel scope" in h.message) for h in found] == [("warning", True)]


def test_the_same_pattern_inside_that_devices_own_scope_is_caught():
    b = two_ranks()
    scope(b, "super_kernel_begin", "rank1")
    b.kernel("rank1", writes="a1", op="aten::mul", cores=EARLY)
    b.kernel("rank0", reads="a0", op="aten::sub")                   # rank 0's work in between
    b.kernel("rank1", reads="a1", op="aten::add")
    scope(b, "super_kernel_end", "rank1")
    (h,) = super_kernel.find(b.trace)
    assert h.severity == "error" and h.ops == ["aten::mul", "aten::add"] and "reads" in h.message


def test_an_end_on_another_device_does_not_close_the_scope():
    b = two_ranks()
    scope(b, "super_kernel_begin", "rank0")
    scope(b, "super_kernel_end", "rank1")
    found = super_kernel.find(b.trace)
    assert sorted("has no open" in h.message or "never ended" in h.message for h in found) == [True, True]
