"""The emulated TorchAir backend: what ``torch.compile(model, backend=torchair.get_npu_backend(...))``
does on the CPU.

* ``pipeline``: Dynamo graph -> AOTAutograd -> the common FX passes and checks -> a mode's graph;
* ``fxgraph``: what the passes read from an FX graph (scopes, sites, inputs);
* ``runner``: executing an FX graph node by node over NPU tensors;
* ``ge``: GE mode (``max-autotune``): per-op streams, compiler-inserted events, per-op core limits;
* ``aclgraph_passes`` / ``aclgraph``: reduce-overhead: fork/join events, stream limits, capture per
  graph key, replay, memory-reuse modes;
* ``events``: events TorchAir creates itself; ``records``: ``npugraph.graphs`` entries.
"""
