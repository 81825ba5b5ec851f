"""``torchair._ge_concrete_graph``: the parts of TorchAir's GE graph package user code touches."""
