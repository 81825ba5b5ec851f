"""The plugin's own error for what it does not emulate (no torch import here).

Why a class of its own: errors that mirror torch_npu and TorchAir keep the real products' types and
messages (``RuntimeError`` with an error code, TorchAir's ``NotImplementedError("... ge_converter is
not implemented!")``), because user code may catch them and tests may match them; an error that only
the emulator raises (an op without CPU math, an op feature or an API it does not model) is a
``NotEmulated``, so a suite can tell "my code is wrong" from "the emulator cannot run this" and skip on
the latter::

    try:
        out = model(x)
    except pytest_npugraph.NotEmulated as exc:
        pytest.skip(str(exc))

It derives from ``NotImplementedError``: code that catches that keeps working.  Its message names
what is missing and how to go on (supply the op with the ``pytest_npugraph_register_ops`` hook, use
another API, ...).
"""


class NotEmulated(NotImplementedError):
    """Something pytest-npugraph does not emulate (distinct from errors mirroring torch_npu's)."""
