"""``dtype_promote`` (GE converters' helper; converters are not run by the emulator)."""


def dtype_promote(*tensors, target_dtype):
    from torchair.ge._ge_graph import not_built

    raise not_built("dtype_promote")
