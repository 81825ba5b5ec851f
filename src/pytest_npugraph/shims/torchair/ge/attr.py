"""``torchair.ge.attr``: the typed attribute values of a GE custom op (``custom_op(..., attrs={...})``);
they hold and check their values (the GE graph they would be written to is not built)."""
__all__ = ["Bool", "DataType", "Float", "Int", "ListBool", "ListDataType", "ListFloat", "ListInt", "ListListFloat",
           "ListListInt", "ListStr", "Str"]


class _Attr:
    _kind = object

    def __init__(self, value):
        self._check(value)
        self.value = value

    def _check(self, value):
        if not isinstance(value, self._kind) or (self._kind is int and isinstance(value, bool)):
            raise AssertionError(f"{type(self).__name__} attr value must be {self._kind.__name__}, got "
                                 f"{type(value).__name__}")

    def __repr__(self):
        return f"{type(self).__name__}({self.value!r})"


class _ListAttr(_Attr):
    _item = _Attr

    def _check(self, value):
        if not isinstance(value, (list, tuple)):
            raise AssertionError(f"{type(self).__name__} attr value must be a list, got {type(value).__name__}")
        for v in value:
            self._item(v)


def _attr_type(name, base, **fields):
    return type(name, (base,), dict(fields, __module__=__name__))


def _scalar(name, kind):
    return _attr_type(name, _Attr, _kind=kind)


def _list(name, item):
    return _attr_type(name, _ListAttr, _item=item)


Int, Float, Str, Bool, DataType = (_scalar(name, kind) for name, kind in (
    ("Int", int), ("Float", float), ("Str", str), ("Bool", bool), ("DataType", int)))
ListInt, ListFloat, ListStr, ListBool, ListDataType = (_list("List" + item.__name__, item) for item in (
    Int, Float, Str, Bool, DataType))
ListListInt, ListListFloat = _list("ListListInt", ListInt), _list("ListListFloat", ListFloat)
