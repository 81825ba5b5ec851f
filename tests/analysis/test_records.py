"""Trace records are frozen dataclasses (``trace._record`` builds them fast through a hidden slot base):
what analyses, reports and tests rely on holds."""
import copy
import dataclasses
import pickle

import pytest

from pytest_npugraph import trace as T

SITE = T.Site("model.py", 12, "forward")
SPAN = T.Span(0, 4096, 6144, 7)


def kernel(**changes):
    fields = dict(seq=3, stream=2, op="aten::add.Tensor", reads=(SPAN,), writes=(), site=SITE)
    fields.update(changes)
    return T.Kernel(**fields)


def test_fields_defaults_and_positional_order():
    k = T.Kernel(3, 2, "aten::mm")
    assert (k.seq, k.stream, k.op, k.reads, k.writes, k.site, k.cores, k.graph) == \
        (3, 2, "aten::mm", (), (), T.UNKNOWN_SITE, T.OpCores(), None)
    assert [f.name for f in dataclasses.fields(T.Free)] == ["seq", "block", "site"]
    with pytest.raises(TypeError):
        T.Free(1)


def test_records_are_frozen():
    k = kernel()
    with pytest.raises(dataclasses.FrozenInstanceError):
        k.seq = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        del k.op


def test_equality_hash_and_repr_are_by_value_and_type():
    assert kernel() == kernel() and hash(kernel()) == hash(kernel())
    assert kernel() != kernel(seq=4)
    assert T.EventRecord(1, 2, 3) != T.EventWait(1, 2, 3)      # same fields, another kind
    assert {SPAN: 1}[T.Span(0, 4096, 6144, 7)] == 1
    assert repr(T.Free(5, 7, SITE)) == "Free(seq=5, block=7, site=Site(path='model.py', line=12, func='forward'))"


def test_replace_pickle_and_copy_give_equal_records():
    k = kernel()
    assert dataclasses.replace(k, seq=9) == kernel(seq=9)
    assert pickle.loads(pickle.dumps(k)) == k
    assert copy.deepcopy(k) == k and copy.copy(k) == k


def test_markers_keep_their_kind_and_facts():
    m = T.DeviceCores(0, 0, 24, 48)
    assert isinstance(m, T.Marker) and m.what == "device" and m.site == T.UNKNOWN_SITE
    assert m.facts() == {"device": 0, "cube": 24, "vector": 48}


def test_a_record_cannot_be_subclassed():
    with pytest.raises(TypeError, match="cannot be subclassed"):
        class Mine(T.Kernel):
            pass
