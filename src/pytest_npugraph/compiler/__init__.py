"""The emulated TorchAir / npugraph_ex compiler: what ``torch.compile(model, backend=...)`` does on the
CPU.  A layer above the runtime: like the real TorchAir it is a client of the ``torch.npu`` public API
(streams, events, ``NPUGraph`` capture and replay), plus the runtime's explicit hooks for what the
emulator adds (trace records in ``emit``, compiler-owned GE streams, pool resets).  The shims
(``torchair``, ``torch_npu``) call into it; it never imports them.

* ``settings``: the frozen ``Settings`` every part reads (built once per backend from a config);
* ``pipeline``: Dynamo graph -> AOTAutograd -> the common FX passes and checks -> a mode's graph;
* ``fxgraph``: what the passes read from an FX graph (scopes, sites, inputs);
* ``runner``: executing an FX graph node by node over NPU tensors;
* ``ge``: GE mode (``max-autotune``): per-op streams, compiler-inserted events, per-op core limits;
* ``aclgraph_passes`` / ``aclgraph``: reduce-overhead / npugraph_ex: fork/join events, stream limits,
  capture per graph key, replay, memory-reuse modes; ``reinplace``: TorchAir's reinplace passes;
* ``events``: events TorchAir creates itself; ``scope_stack``: the executed scope attributes;
* ``emit``: the trace records the compiler writes itself.
"""
