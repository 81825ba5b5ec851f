"""The emulated Ascend runtime: devices, streams, events, allocator and NPU tensors."""
