"""Emulated ``torch_npu.op_plugin.atb``."""
