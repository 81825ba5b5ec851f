"""Bad arguments fail at the call with the exception torch_npu's bindings raise (torch_npu_api.md;
Ascend/pytorch ``torch_npu/csrc/npu/Module.cpp``, ``Stream.cpp``, ``Event.cpp``), and never reach
the trace: before, ``set_stream_limit(s, "4", 8)`` was accepted and the analysis crashed at test end,
hiding every hazard of the test."""
import ctypes
import inspect
import re

import pytest
import torch
import torch_npu

from torch_npu import _args

INTEGER_REQUIRED = "an integer is required"


@pytest.mark.parametrize("bad, exc, match", [
    ("4", TypeError, INTEGER_REQUIRED), ([1], TypeError, INTEGER_REQUIRED), (None, TypeError, INTEGER_REQUIRED),
    (4.5, TypeError, INTEGER_REQUIRED), (2 ** 70, OverflowError, "too large to convert to C unsigned long"),
    (2 ** 40, ValueError, "Overflow when unpacking long long"), (-3, OverflowError, "can't convert negative value"),
])
def test_set_stream_limit_rejects_non_uint32_core_counts(npugraph, bad, exc, match):
    s = torch.npu.Stream()
    with pytest.raises(exc, match=re.escape(match)):
        torch.npu.set_stream_limit(s, bad, 8)
    with pytest.raises(exc, match=re.escape(match)):
        torch.npu.set_stream_limit(s, 8, bad)
    assert torch.npu.get_stream_limit(s)["vector_core_num"] == npugraph.vector_cores   # the bad value never landed
    npugraph.assert_clean()


def test_set_stream_limit_takes_a_bool_as_the_binding_does(npugraph):
    s = torch.npu.Stream()
    torch.npu.set_stream_limit(s, True, 8)          # PyLong_AsUnsignedLong(True) == 1
    assert torch.npu.get_stream_limit(s) == {"cube_core_num": 1, "vector_core_num": 8}


def test_set_device_limit_rejects_a_string(npugraph):
    with pytest.raises(TypeError, match=INTEGER_REQUIRED):
        torch.npu.set_device_limit(0, "4", 8)
    assert str(inspect.signature(torch.npu.set_device_limit)) == "(device, cube_num=-1, vector_num=-1)"


def test_stream_and_event_constructors_parse_like_pyarg(npugraph):
    with pytest.raises(TypeError, match="'str' object cannot be interpreted as an integer"):
        torch.npu.Event(enable_timing="x")
    with pytest.raises(OverflowError, match="unsigned byte integer is greater than maximum"):
        torch.npu.Event(blocking=300)
    with pytest.raises(TypeError, match="'str' object cannot be interpreted as an integer"):
        torch.npu.Stream(priority="hi")
    with pytest.raises(OverflowError, match="signed integer is greater than maximum"):
        torch.npu.Stream(priority=2 ** 31)
    with pytest.raises(TypeError, match="argument 6 must be int, not str"):
        torch.npu.ExternalStream("x")
    with pytest.raises(TypeError, match="'bogus' is an invalid keyword argument for this function"):
        torch.npu.Stream(bogus=1)


def test_event_methods_check_their_handles(npugraph):
    e = torch.npu.Event()
    with pytest.raises(TypeError, match=r"record\(\): argument 'stream' must be torch_npu.npu.Stream, not str"):
        e.record("s")
    with pytest.raises(TypeError, match=r"wait\(\): argument 'stream' must be torch_npu.npu.Stream, not int"):
        e.wait(5)
    e.record()
    with pytest.raises(TypeError, match=r"elapsed_time\(\): argument 'end_event' must be torch_npu.npu.Event"):
        e.elapsed_time("x")
    npugraph.assert_clean()


def test_python_level_attribute_errors_match_torch_npu(npugraph):
    # torch_npu's own Python reads these attributes unchecked; the emulator raises the same error on purpose
    with pytest.raises(AttributeError, match="'str' object has no attribute 'device'"):
        with torch.npu.stream("x"):
            pass
    with pytest.raises(AttributeError, match="'int' object has no attribute 'stream_id'"):
        torch.npu.set_stream(3)
    with pytest.raises(RuntimeError, match="invalid device id -7"):
        torch.npu.current_stream(-7)
    with pytest.raises(TypeError, match=r"caching_allocator_alloc received an invalid combination of arguments - "
                                        r"got \(str, int\)"):
        torch.npu.caching_allocator_alloc("x")


# ------------------------------------------------------- the conversions, against CPython itself
def _pyarg(fmt, names, kwargs):
    """The real PyArg_ParseTupleAndKeywords (through ctypes) on one keyword argument."""
    f = ctypes.pythonapi.PyArg_ParseTupleAndKeywords
    f.restype = ctypes.c_int
    kwlist = (ctypes.c_char_p * (len(names) + 1))(*[n.encode() for n in names], None)
    slots = [ctypes.c_longlong(0) for _ in names]
    f.argtypes = [ctypes.py_object, ctypes.py_object, ctypes.c_char_p, ctypes.c_void_p] + [ctypes.c_void_p] * len(names)
    f((), kwargs, fmt.encode(), ctypes.cast(kwlist, ctypes.c_void_p), *[ctypes.addressof(s) for s in slots])


VALUES = ["x", 4.5, None, [1], True, 0, -1, 255, 256, 2 ** 31, -2 ** 31 - 1, 2 ** 63, 2 ** 64, 2 ** 70, -2 ** 70]
STREAM_SPEC = (("priority", "i", 0), ("is_sync_launch", "i", 0), ("stream_id", "L", 0), ("device_index", "L", 0),
               ("device_type", "L", 0), ("stream_ptr", "K", 0))
EVENT_SPEC = (("enable_timing", "b", 0), ("blocking", "b", 0), ("interprocess", "b", 0), ("graph_external", "b", 0))


def _outcome(call):
    try:
        call()
    except Exception as exc:         # noqa: BLE001 - compared by type and text
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("spec", [STREAM_SPEC, EVENT_SPEC], ids=["stream |iiLLLK", "event |bbbb"])
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_parse_matches_cpython_pyarg(spec, value):
    fmt = "|" + "".join(letter for _, letter, _ in spec)
    names = [name for name, _, _ in spec]
    for name in names:
        expected = _outcome(lambda: _pyarg(fmt, names, {name: value}))
        assert _outcome(lambda: _args.parse("f", spec, (), {name: value})) == expected, name


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_unpack_uint32_matches_torch(value):
    f = ctypes.pythonapi.PyLong_AsUnsignedLong
    f.restype, f.argtypes = ctypes.c_ulong, [ctypes.py_object]
    expected = _outcome(lambda: f(value))
    got = _outcome(lambda: _args.unpack_uint32(value))
    if expected is None and value > (1 << 32) - 1:        # torch's own 32-bit range check, after CPython's
        expected = (ValueError, "Overflow when unpacking long long")
    assert got == expected
