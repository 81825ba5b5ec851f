"""``torchair._acl_concrete_graph.cat_optimization``: TorchAir's ``remove_cat_ops`` pass (each input of
a ``cat`` written straight into a slice of the result with the op's ``out=`` form).  The module
imports, as TorchAir's tests save and restore its pass; the emulator's aclgraph modes do not apply the
pass, and calling it raises ``pytest_npugraph.NotEmulated``."""
from __future__ import annotations

from pytest_npugraph.errors import NotEmulated

__all__ = ["optimize_cat_with_out_tensor"]


def optimize_cat_with_out_tensor(gm, config=None):
    raise NotEmulated("pytest-npugraph does not apply TorchAir's remove_cat_ops pass "
                      f"({__name__}.optimize_cat_with_out_tensor): cat ops stay in the emulated graphs")
