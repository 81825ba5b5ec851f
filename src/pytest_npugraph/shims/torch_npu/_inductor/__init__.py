"""Emulated ``torch_npu._inductor``: importing it registers torch_npu's Inductor backend for the npu
device.  Under emulation the npu device's Inductor entry points are registered by ``import torch_npu``
itself (``torch_npu._accelerator``), so this import has nothing left to do; it exists because model
code imports it for that side effect (vLLM-Ascend's worker)."""
