"""Register the torch_npu custom ops as ``torch.ops.npu.*`` with CPU reference kernels.

Every op of torch_npu's table (``registry.table()``: the family specs, then the generated schemas)
and every op of users' ``pytest_npugraph_register_ops`` hook (which replaces a table op of the same
name) is defined.  Each op gets a CPU kernel (the reference math; on NPU tensors it runs through the
NpuTensor dispatch, which records the task) and a Meta kernel (so torch.compile can trace it).  An
op without math gets a CPU kernel raising :func:`missing_error` and a Meta/fake rule read off its
schema.  Ops with math and users' ops are defined at install; the others (some 400) when first
looked up (``torch.ops.npu.<name>``, ``torch_npu.<name>``), which keeps ``import torch_npu`` fast.

A mutable op ``op`` (``Tensor(a!)`` arguments) with a registered ``op_functional`` also gets a
Functionalize kernel, the Python counterpart of the one torchgen writes for torch_npu: under
functionalization (``torch.func.functionalize``, AOTAutograd) ``op`` becomes a call of
``op_functional`` whose trailing outputs replace the mutated arguments, so graphs hold the
functional op (and ``copy_`` epilogues for mutated graph inputs), not ``auto_functionalized``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import keyword
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

from ...errors import NotEmulated
from ..._context import CONTEXT
from . import factory

NAMESPACE = "npu"
_library: Optional[torch.library.Library] = None
_libraries: dict = {}  # namespace -> torch.library.Library ("npu": _library; "atb": torch_npu's ATB ops)
SPECS: dict = {}      # name -> OpSpec registered in this process
_NAMESPACE_OF: dict = {}  # op name (overload packet) -> its namespace, for the ops registered


def _library_of(spec) -> torch.library.Library:
    namespace = getattr(spec, "namespace", NAMESPACE)
    if namespace == NAMESPACE:
        return _library
    if namespace not in _libraries:
        # torch_npu's atb namespace is ours alone; a user's namespace (``_C_ascend``) may get other
        # fragments from the user's own code
        _libraries[namespace] = torch.library.Library(namespace, "DEF" if namespace == "atb" else "FRAGMENT")
    return _libraries[namespace]


@dataclass(frozen=True)
class UserOp:
    name: str
    schema: str
    impl: Callable
    cores: object = None
    namespace: str = NAMESPACE


class OpRegistry:
    """Handed to ``pytest_npugraph_register_ops``: ``registry.register(name, schema, impl, cores=...)``.

    ``schema`` is the op's schema without the namespace, e.g.
    ``"npu_my_op(Tensor x, int k=1) -> Tensor"``; ``impl`` computes it on CPU tensors;
    ``cores`` is a profile dict such as ``{"kind": "AIV", "vector": "all", "all_resident": False}``.
    The op is ``torch.ops.npu.<name>`` (and ``torch_npu.<name>``); a qualified name
    (``"_C_ascend::rotary_embedding"``) or ``namespace="_C_ascend"`` puts it in another namespace,
    as a C++ extension's ops are (vLLM-Ascend's ``torch.ops._C_ascend.*``).
    """

    def __init__(self):
        self.ops: list = []

    def register(self, name: str, schema: str, impl: Callable, cores=None, namespace: Optional[str] = None) -> None:
        if "::" in name:
            qualifier, name = name.split("::", 1)
            if namespace is not None and namespace != qualifier:
                raise ValueError(f"op {qualifier}::{name} given namespace={namespace!r} as well")
            namespace = qualifier
        namespace = NAMESPACE if namespace is None else namespace
        if not namespace.isidentifier() or namespace in ("aten", "prims", "atb", "air"):
            raise ValueError(f"namespace {namespace!r} for {name!r}: give your op's own namespace (a Python identifier "
                             f"other than aten, prims, atb and air), or none for torch.ops.npu")
        if not schema.startswith(name + "("):
            raise ValueError(f"schema for {name!r} must start with '{name}(', got {schema!r}")
        self.ops.append(UserOp(name, schema, impl, cores, namespace))


@contextlib.contextmanager
def _real_cpu_compute():
    """Plain CPU compute inside a meta kernel: FakeTensorMode runs meta kernels with the Meta key
    forced on for every op (and a tracer's modes live), so the reference's own factories
    (``torch.arange``...) would otherwise go to Meta and its decompositions, and loop."""
    with _disable_current_modes(), torch._C._PreserveDispatchKeyGuard():
        torch._C._set_meta_in_tls_dispatch_include(False)
        yield


def _meta_kernel(impl):
    """Shapes by running the reference on zeros of the same shapes; with symbolic sizes (a dynamic-shape
    graph) on the meta tensors themselves, whose ops carry the symbols through."""
    def to_cpu(x):
        if isinstance(x, torch.Tensor):
            return torch.zeros(x.shape, dtype=x.dtype)
        return x

    def kernel(*args, **kwargs):
        if _symbolic(args, kwargs):
            return impl(*args, **kwargs)
        with _real_cpu_compute():
            out = impl(*tree_map(to_cpu, args), **tree_map(to_cpu, kwargs))
            return tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, out)
    return kernel


def _symbolic(args, kwargs) -> bool:
    """Whether a tensor argument has a symbolic size (zeros of its shape cannot be made)."""
    for x in tree_flatten((args, kwargs))[0]:
        if isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in x.shape):
            return True
    return False


FUNCTIONAL_SUFFIX = "_functional"
_FUNCTIONALIZE = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
_FUNCTIONALIZED: set = set()    # mutable ops given a Functionalize kernel in this process


def _functionalize_kernel(mutable, functional):
    """The Functionalize kernel of OpOverload ``mutable``, given its out-of-place ``functional``
    variant (same arguments; returns ``mutable``'s returns followed by the new value of each
    written argument, in argument order), as torchgen generates it for a mutable op."""
    schema = mutable._schema
    arguments = schema.arguments
    written = [i for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write]
    n_returns = len(schema.returns)

    def argument(args, kwargs, i):
        a = arguments[i]
        if not a.kwarg_only and i < len(args):
            return args[i]
        return kwargs.get(a.name, a.default_value if a.has_default_value() else None)

    def is_functional(x) -> bool:
        return isinstance(x, torch.Tensor) and torch._is_functional_tensor(x)

    def unwrap(x):
        if is_functional(x):
            torch._sync(x)
            return torch._from_functional_tensor(x)
        return x

    def kernel(*args, **kwargs):
        targets = [argument(args, kwargs, i) for i in written]
        if not all(is_functional(t) for t in targets):
            others = [argument(args, kwargs, i) for i in range(len(arguments)) if i not in written]
            if any(is_functional(x) for x in tree_flatten(others)[0]):
                raise RuntimeError(
                    f"{schema.name}: mutating a non-functional tensor with a functional tensor is not allowed. "
                    "Please ensure that all of your inputs are wrapped inside of a functionalize() call.")
            with torch._C._ExcludeDispatchKeyGuard(_FUNCTIONALIZE):   # nothing functional: run it as is
                return mutable(*args, **kwargs)
        uargs, ukwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_FUNCTIONALIZE):
            out = functional(*uargs, **ukwargs)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        for target, value in zip(targets, out[n_returns:]):
            torch._functionalize_replace(target, value)
            torch._functionalize_commit_update(target)
            torch._functionalize_sync(target)
        results = tuple(torch._to_functional_tensor(r) if isinstance(r, torch.Tensor) else r
                        for r in out[:n_returns])
        if n_returns == 0:
            return None
        return results[0] if n_returns == 1 else results
    return kernel


def _overload(qualified: str):
    base, _, overload = qualified.partition(".")
    namespace = SPECS[qualified].namespace if qualified in SPECS else NAMESPACE
    return getattr(getattr(torch.ops, namespace), base).__getattr__(overload or "default")


def _returns_self_kernel(mutable, out_of_place):
    """The Functionalize kernel of an in-place op ``x_(self, ...) -> Tensor(a!)`` (or ``-> ()``) whose
    out-of-place twin ``x(self, ...) -> Tensor`` returns the new ``self`` (``scatter_update_`` /
    ``scatter_update``): the twin computes, ``self`` takes its value."""
    n_returns = len(mutable._schema.returns)

    def functional(*args, **kwargs):
        new = out_of_place(*args, **kwargs)
        return (new, new) if n_returns else new
    return _functionalize_kernel(mutable, functional)


def _in_place_twin(qualified: str):
    """``x`` for an in-place op ``x_`` of torch_npu's table whose only write is its first argument and
    whose result (if any) is that argument; else None."""
    from . import _generated

    base, dot, overload = qualified.partition(".")
    twin = next((f for f, i in _generated.INPLACE_VARIANTS.items() if i == base), None)
    if twin is None or twin + dot + overload not in SPECS:
        return None
    schema = _overload(qualified)._schema
    written = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    returns = schema.returns
    if written != [0] or len(returns) > 1 or (returns and (returns[0].alias_info is None
                                                           or not returns[0].alias_info.is_write)):
        return None
    return twin + dot + overload


def _add_functionalization(qualified: str) -> None:
    """Pair ``qualified`` (mutable) with ``<base>_functional[.overload]``, or with its out-of-place twin
    (``x_`` with ``x``), if both are registered."""
    if qualified in _FUNCTIONALIZED or qualified not in SPECS:
        return
    base, dot, overload = qualified.partition(".")
    partner = base + FUNCTIONAL_SUFFIX + dot + overload
    mutable = _overload(qualified)
    if not mutable._schema.is_mutable:
        return
    if partner in SPECS:
        kernel = _functionalize_kernel(mutable, _overload(partner))
    else:
        twin = _in_place_twin(qualified)
        if twin is None:
            return
        kernel = _returns_self_kernel(mutable, _overload(twin))
    _library_of(SPECS[qualified]).impl(qualified, kernel, "Functionalize")
    _FUNCTIONALIZED.add(qualified)


def _define(spec) -> None:
    qualified = spec.schema.split("(", 1)[0]          # "npu_grouped_matmul.List"
    if qualified in SPECS:
        return
    library = _library_of(spec)
    library.define(spec.schema, tags=_tags(qualified))
    if spec.impl is not None:
        library.impl(qualified, spec.impl, "CPU")
        library.impl(qualified, spec.meta or _meta_kernel(spec.impl), "Meta")
    else:
        library.impl(qualified, _missing_kernel(spec), "CPU")
        meta = spec.meta or _schema_meta_kernel(spec)
        library.impl(qualified, meta, "Meta")
        # FakeTensorMode turns a Meta kernel's NotImplementedError into "Operator does not support
        # running with fake tensors"; a fake impl's error reaches the user as it is.
        torch.library.register_fake(f"{spec.namespace}::{qualified}", meta, lib=library)
    base, _, overload = qualified.partition(".")
    op = getattr(getattr(getattr(torch.ops, spec.namespace), base), overload or "default")
    if factory.is_factory(op._schema):      # no tensor argument: the device argument picks the backend
        select = factory.backend_select_kernel(f"{spec.namespace}::{base}")
        select.overload = op
        library.impl(qualified, select, "BackendSelect")
    if spec.autograd is not None:
        setup, backward = spec.autograd
        torch.library.register_autograd(f"{spec.namespace}::{qualified}", backward, setup_context=setup, lib=library)
    SPECS[qualified] = spec
    _NAMESPACE_OF[spec.base] = spec.namespace


def _tags(qualified: str) -> tuple:
    from . import _generated

    return tuple(getattr(torch.Tag, tag) for tag in _generated.TAGS.get(qualified, ()) if hasattr(torch.Tag, tag))


# ------------------------------------------------------------------------ ops without math
def missing_error(spec) -> NotEmulated:
    """What calling (or tracing) an op without CPU math raises: the op, its schema, and the
    ``pytest_npugraph_register_ops`` snippet that supplies it."""
    from .registry import atb_exports

    name = spec.name
    schema = torch._C.parse_schema(f"{spec.namespace}::{spec.schema}")
    params, star = [], False
    for a in schema.arguments:
        if a.kwarg_only and not star:
            params.append("*")
            star = True
        pname = a.name + "_" if keyword.iskeyword(a.name) else a.name
        params.append(f"{pname}={a.default_value!r}" if a.has_default_value() else pname)
    fn = name.replace(".", "_")
    profile = {k: v for k, v in (spec.cores or {"kind": "AIV", "vector": "all"}).items()
               if ((v is False) if k == "limit_applies" else v)}
    return NotEmulated(
        f"torch.ops.{spec.namespace}.{name} ({atb_exports().get(spec.base, 'torch_npu')}.{spec.base}) has no CPU "
        f"implementation in pytest-npugraph: the emulator knows its schema, not its math.\n"
        f"Schema: {spec.namespace}::{spec.schema}\n"
        f"Supply it in your conftest.py:\n\n"
        f"    def pytest_npugraph_register_ops(registry):\n"
        f"        def {fn}({', '.join(params)}):\n"
        f"            ...  # compute on CPU tensors; return what the schema returns\n"
        f"        registry.register({name!r}, {spec.schema!r},\n"
        f"                          {fn}, cores={profile!r})\n")


def _missing_kernel(spec):
    def kernel(*args, **kwargs):
        raise missing_error(spec)
    kernel.__name__ = spec.name.replace(".", "_")
    return kernel


def _schema_meta_kernel(spec):
    """Meta of an op without math where its schema alone fixes the result: ``-> ()`` returns
    nothing, ``-> Tensor(a!)`` returns the argument it aliases; anything else cannot be traced."""
    rule = []

    def kernel(*args, **kwargs):
        if not rule:
            rule.append(_schema_rule(spec))
        return rule[0](args, kwargs)
    return kernel


def _schema_rule(spec):
    schema = torch._C.parse_schema(f"{spec.namespace}::{spec.schema}")
    if not schema.returns:
        return lambda args, kwargs: None
    sources = []
    for r in schema.returns:
        alias = r.alias_info
        match = None
        if alias is not None and alias.is_write:
            match = next((i for i, a in enumerate(schema.arguments)
                          if a.alias_info is not None and a.alias_info.before_set == alias.before_set), None)
        if match is None:
            def refuse(args, kwargs):
                raise missing_error(spec)
            return refuse
        sources.append(match)
    arguments = schema.arguments

    def aliased(args, kwargs):
        values = [args[i] if not arguments[i].kwarg_only and i < len(args) else kwargs[arguments[i].name]
                  for i in sources]
        return values[0] if len(values) == 1 else tuple(values)
    return aliased


# ------------------------------------------------------------------------ lazy definition
_PENDING: Dict[str, list] = {}     # base name -> specs of its overloads, defined on first lookup


def _define_base(base: str) -> None:
    """Define every overload of ``base`` (and of its ``_functional`` twin) and pair them."""
    specs = _PENDING.pop(base, None)
    if specs is None:
        return
    from . import _generated

    for spec in specs:
        _define(spec)
    partner = base[:-len(FUNCTIONAL_SUFFIX)] if base.endswith(FUNCTIONAL_SUFFIX) else base + FUNCTIONAL_SUFFIX
    _define_base(partner)
    in_place = _generated.INPLACE_VARIANTS.get(base)
    if in_place is not None:                        # x: its in-place x_ pairs with it
        _define_base(in_place)
    for twin, inplace in _generated.INPLACE_VARIANTS.items():
        if inplace == base:                         # x_: needs x to be functionalized
            _define_base(twin)
    for spec in specs:
        _add_functionalization(spec.name)
        if spec.name.split(".", 1)[0].endswith(FUNCTIONAL_SUFFIX):
            _add_functionalization(spec.name.replace(FUNCTIONAL_SUFFIX, "", 1))
        if in_place is not None:
            _add_functionalization(in_place + spec.name[len(base):])


class _LazyNamespace(torch._ops._OpNamespace):
    """``torch.ops.npu`` / ``torch.ops.atb``: an op of torch_npu's table is defined when first looked up."""

    def __getattr__(self, op_name: str):
        if op_name in _PENDING and _PENDING[op_name][0].namespace == self.name:
            _define_base(op_name)
        return super().__getattr__(op_name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(op_names(self.name)))


def packet(name: str):
    """``torch.ops.npu.<name>`` (``torch.ops.atb.<name>`` for an ATB op) if torch_npu (or a user) has an
    op of that name, else None (a user's op in its own namespace is not torch_npu's)."""
    if name in _PENDING:
        _define_base(name)
    namespace = _NAMESPACE_OF.get(name, NAMESPACE)
    if namespace not in (NAMESPACE, "atb"):
        return None
    return getattr(getattr(torch.ops, namespace), name, None)


def define_all() -> None:
    """Define every pending op now (one batch)."""
    for base in list(_PENDING):
        _define_base(base)


def op_names(namespace: str = NAMESPACE) -> list:
    """Every op name (overload packet) of torch_npu's ``namespace`` (``npu``: the ops torch_npu exports
    as ``torch_npu.<name>`` and ``torch.<name>``; ``atb``: its ATB ops), defined or pending."""
    return sorted({name.split(".", 1)[0] for name, spec in SPECS.items() if spec.namespace == namespace} |
                  {base for base, specs in _PENDING.items() if specs[0].namespace == namespace})


# ------------------------------------------------------------------------ install
def _override(spec, user):
    """A user's registration of an op torch_npu already has replaces it: the user's impl (and
    profile, else the op's) on the user's schema.  The op's facts that depend on its signature
    (TorchAir reinplace indices, the MC2 kernel) stay only when the schema is the real one."""
    same = torch._C.parse_schema(f"{NAMESPACE}::{user.schema}") == torch._C.parse_schema(
        f"{NAMESPACE}::{spec.schema}")
    changes = dict(schema=user.schema, impl=user.impl, meta=None, cores=user.cores or spec.cores)
    if not same:
        changes.update(reinplace=None, mc2=None, mc2_math=None)
    return dataclasses.replace(spec, **changes)


def install() -> None:
    """Define the ops of every family and every op users register through the hook now, and make
    the rest of torch_npu's op table appear on first lookup (once per process)."""
    global _library
    if _library is not None:
        return
    from . import registry
    from .spec import OpSpec

    table = dict(registry.table())
    eager = {spec.base for spec in registry.specs() if spec.impl is not None}
    if CONTEXT.hook is not None:
        ops = OpRegistry()
        CONTEXT.hook.pytest_npugraph_register_ops(registry=ops)
        for user in ops.ops:
            known = table.get(user.name)
            # a bare name of torch_npu's ATB op (torch_npu.<name>) is that op: the override keeps it in atb
            if known is not None and known.namespace != user.namespace and not (
                    known.namespace == "atb" and user.namespace == NAMESPACE):
                raise ValueError(f"pytest_npugraph_register_ops: {user.namespace}::{user.name} has the name of "
                                 f"torch_npu's {known.namespace}::{user.name}; op names must differ across namespaces")
            table[user.name] = (_override(known, user) if known is not None
                                else OpSpec(user.schema, user.impl, user.cores, namespace=user.namespace))
            eager.add(user.name.split(".", 1)[0])
    _library = torch.library.Library(NAMESPACE, "DEF")
    for spec in table.values():
        _PENDING.setdefault(spec.name.split(".", 1)[0], []).append(spec)
    for base in sorted(eager):
        _define_base(base)
    for name in {spec.namespace for spec in table.values()}:
        namespace = getattr(torch.ops, name)
        if type(namespace) is torch._ops._OpNamespace:
            namespace.__class__ = _LazyNamespace


def cores_of(name: str):
    """The declared profile of custom op ``name`` (any overload), or None."""
    spec = SPECS.get(name)
    if spec is None and name.split(".", 1)[0] in _PENDING:
        spec = next((s for s in _PENDING[name.split(".", 1)[0]] if s.name == name), None)
    return None if spec is None else spec.cores
