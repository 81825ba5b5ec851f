"""``torchair.ge_concrete_graph``: TorchAir's former GE API path, kept for compatibility (importing
its modules logs that it will be removed, as TorchAir does)."""
