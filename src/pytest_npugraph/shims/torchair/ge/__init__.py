"""``torchair.ge``: TorchAir's GE graph API for custom ops (``custom_op``, ``Const``, ``Cast``, ``Clone``,
the types and ``attr``).  TorchAir calls them inside a GE converter (``register_fx_node_ge_converter``)
to lower an op into the GE graph.  The emulator runs each op of a compiled graph with its torch kernel,
so converters are registered but not run, and these builders raise ``NotImplementedError`` saying so.
A custom op defined as TorchAir's docs show (``torch.library`` schema, Meta and NPU kernels, a GE
converter) runs in every mode through its kernel."""
__all__ = ["custom_op", "Const", "Cast", "DataType", "Format", "Tensor", "TensorSpec", "Clone"]

from torchair.ge._ge_graph import DataType, Format, TensorBase as Tensor, TensorSpecBase as TensorSpec, not_built

from . import attr  # noqa: F401


def custom_op(op_type: str, *args, inputs=None, outputs=None, attrs=None, node_name=None):
    raise not_built(f"custom_op({op_type!r})")


def Const(v, dtype: int = None, node_name=None, readable=True):
    raise not_built("Const")


def Cast(x, *, dst_type: int, dependencies=[], node_name=None):  # noqa: B006  (as torchair's signature)
    raise not_built("Cast")


def Clone(x, *, dependencies=[], node_name=None):  # noqa: B006
    raise not_built("Clone")
