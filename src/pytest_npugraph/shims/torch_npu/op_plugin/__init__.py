"""Emulated ``torch_npu.op_plugin``: the ops themselves live in ``pytest_npugraph.runtime.ops``."""
