"""Every torch_npu op the emulator knows, one :class:`~.spec.OpSpec` per overload, and the tables
derived from them.

Family modules (any module of this package whose name does not start with ``_`` and that defines
``SPECS``) hold the ops with math or with facts of their own; adding a family is adding its file.
Every other op of torch_npu 2.14.0's ``npu`` namespace and of its ATB ops (``torch.ops.atb``) comes
from the generated schema table (``_generated.py``, written by ``tools/gen_op_schemas.py``) as a spec
without math and with a core profile guessed from its name (:func:`default_cores`, :func:`atb_cores`).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import pkgutil
import re
from typing import Dict, List, Optional

from . import _generated
from .spec import OpSpec, cores, cube, mc2, mix, vector

_NOT_FAMILIES = {"spec", "registry", "library", "aten"}
_specs: Optional[List[OpSpec]] = None
_table: Optional[Dict[str, OpSpec]] = None


def family_modules() -> list:
    """The family modules, in name order (imported on first use)."""
    names = sorted(m.name for m in pkgutil.iter_modules([os.path.dirname(__file__)])
                   if not m.name.startswith("_") and m.name not in _NOT_FAMILIES)
    modules = [importlib.import_module(f"{__package__}.{name}") for name in names]
    return [m for m in modules if hasattr(m, "SPECS")]


def specs() -> List[OpSpec]:
    """The family specs (one per overload), each with a core profile."""
    global _specs
    if _specs is None:
        found: List[OpSpec] = []
        seen: Dict[str, str] = {}
        for module in family_modules():
            for spec in module.SPECS:
                if spec.name in seen:
                    raise RuntimeError(f"op {spec.name} has a spec in both {seen[spec.name]} and {module.__name__}")
                seen[spec.name] = module.__name__
                found.append(spec if spec.cores is not None else
                             dataclasses.replace(spec, cores=default_cores(spec.name)))
        _specs = found
    return _specs


def by_name() -> Dict[str, OpSpec]:
    """``{"op" or "op.overload": OpSpec}`` of the family specs."""
    return {spec.name: spec for spec in specs()}


def table() -> Dict[str, OpSpec]:
    """Every op overload: the family specs, then each generated schema without a family spec
    (``impl=None``, the profile :func:`default_cores` or, for an ATB op, :func:`atb_cores` gives its
    name)."""
    global _table
    if _table is None:
        found = by_name()
        for schema in _generated.SCHEMAS:
            name = schema[:schema.index("(")]
            if name not in found:
                found[name] = OpSpec(schema, cores=default_cores(name))
        for schema in _generated.ATB_SCHEMAS:
            name = schema[:schema.index("(")]
            if name not in found:
                found[name] = OpSpec(schema, cores=atb_cores(name), namespace="atb")
        _table = found
    return _table


def generated_names() -> List[str]:
    """Every overload name of torch_npu's ``npu`` namespace, in the yaml's order."""
    return [schema[:schema.index("(")] for schema in _generated.SCHEMAS]


def atb_names() -> List[str]:
    """Every overload name of torch_npu's ATB ops (``torch.ops.atb``)."""
    return [schema[:schema.index("(")] for schema in _generated.ATB_SCHEMAS]


@functools.lru_cache(maxsize=None)
def atb_exports() -> Dict[str, str]:
    """ATB op name -> the module torch_npu exports it from: ``"torch_npu"`` (``torch_npu._npu_paged_attention``)
    or ``"torch_npu.atb"`` (``torch_npu.atb.npu_multi_head_latent_attention``).  Read only."""
    return dict([(name, "torch_npu") for name in _generated.ATB_TOP_LEVEL] +
                [(name, "torch_npu.atb") for name in _generated.ATB_MODULE])


# ----------------------------------------------------------------------------- derived tables
def multi_inplace() -> Dict[str, tuple]:
    """TorchAir's ``register_inplaceable_npu_op`` table: functional op -> (in-place op, mutated args)."""
    return {spec.base: spec.reinplace for spec in specs() if spec.reinplace is not None}


def graph_updatable() -> tuple:
    """Names of the ops whose arguments a captured ``torch.npu.graph(auto_dispatch_capture=True)``
    may update (``NPUGraph.update``)."""
    names = []
    for spec in specs():
        if spec.graph_updatable and spec.base not in names:
            names.append(spec.base)
    return tuple(names)


def mc2_kernels() -> Dict[str, object]:
    """MC2 op name -> its multi-rank kernel (``OpSpec.mc2``)."""
    return {spec.name: spec.mc2 for spec in specs() if spec.mc2 is not None}


# ----------------------------------------------------------------------------- default profiles
_MC2 = re.compile(r"all_reduce|all_gather|reduce_scatter|alltoall|all_to_all|moe_distribute|distribute_barrier")
_ATTENTION = re.compile(r"flash_attention|fusion_attention|attention_score|(^|_)attention(_|$)|mla_prolog"
                        r"|lightning_indexer|_attention_(infer|grad|backward)")
_NOT_ATTENTION = re.compile(r"worker|to_ffn|ffn_to|attention_update|_get_max_workspace|_infer_output")
_MATMUL = re.compile(r"matmul|(^|_)(mm|bmm\w*|gmm|linear|conv\w*|convolution\w*)(_|$)")
_EPILOGUE = re.compile(r"quant|gmm|grouped|gelu|swiglu|add|routing|compress|reduce_sum")


def default_cores(name: str) -> dict:
    """A core profile for an op known only by name: MC2 for fused compute+communication
    (``*_all_reduce*``, ``*_all_gather*``, ``*_reduce_scatter*``, all-to-all, ``npu_moe_distribute*``),
    cube+vector for attention and for matmuls with an epilogue (quantisation, grouping, activation),
    cube for plain matmuls and convolutions, else a vector kernel on every AIV core."""
    base = name.split(".", 1)[0]
    if _MC2.search(base):
        return mc2()
    if _ATTENTION.search(base) and not _NOT_ATTENTION.search(base):
        return mix()
    if _MATMUL.search(base):
        return mix() if _EPILOGUE.search(base) else cube()
    if base.endswith(("_get_max_workspace", "_infer_output")):  # host-side shape/workspace queries
        return cores("AICPU", limit_applies=False)
    return vector()


def atb_cores(name: str) -> dict:
    """A core profile for an ATB op known only by name: an ATB kernel on the core types
    :func:`default_cores` gives the name (MLA kernels: cube and vector), host-side for a workspace
    query (``_npu_paged_attention_get_workspace``)."""
    base = name.split(".", 1)[0]
    if "_get_workspace" in base:
        return cores("AICPU", limit_applies=False)
    profile = mix() if "mla" in base else default_cores(name)
    return cores("ATB", cube=profile["cube"], vector=profile["vector"])
