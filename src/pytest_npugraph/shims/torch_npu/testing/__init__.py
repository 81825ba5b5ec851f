"""``torch_npu.testing``: the helpers torch_npu's own test suite is written against.

Only the test-facing surface: ``testcase`` (``TestCase`` with ``assertRtolEqual`` and the
precision-aware ``assertEqual``, ``run_tests``), ``common_utils`` (``create_common_tensor``,
``create_dtype_tensor``, ``SupportedDevices``, ``freeze_rng_state``, ...), ``decorator``
(``Dtypes``, ``Formats``, ``instantiate_tests``) and ``common_distributed``
(``skipIfUnsupportMultiNPU``). Unlike the real package, importing it does not patch
``torch.testing._internal`` (OpInfo dtype tables, disabled-test lists): the emulator has no
per-chip OpInfo configuration to apply.
"""
