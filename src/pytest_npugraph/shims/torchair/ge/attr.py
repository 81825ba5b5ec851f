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


def _scalar(name, kind):
    return type(name, (_Attr,), {"_kind": kind, "__module__": __name__})


Int = _scalar("Int", int)
Float = _scalar("Float", float)
Str = _scalar("Str", str)
Bool = _scalar("Bool", bool)
DataType = _scalar("DataType", int)


def _list(name, item):
    return type(name, (_ListAttr,), {"_item": item, "__module__": __name__})


ListInt = _list("ListInt", Int)
ListFloat = _list("ListFloat", Float)
ListStr = _list("ListStr", Str)
ListBool = _list("ListBool", Bool)
ListDataType = _list("ListDataType", DataType)
ListListInt = _list("ListListInt", ListInt)
ListListFloat = _list("ListListFloat", ListFloat)
