"""Emulated ``torch_npu.multiprocessing``."""
