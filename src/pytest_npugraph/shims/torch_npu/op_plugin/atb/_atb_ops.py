"""Emulated ``torch_npu.op_plugin.atb._atb_ops``: the ATB op lists and their lazy loader.

In torch_npu this module loads ``libop_plugin_atb.so`` and ``_register_atb_extensions()`` binds
``torch.ops.atb.<name>`` to ``torch_npu.<name>`` (``API_LIST``) and ``torch_npu.atb.<name>``
(``ATB_API_LIST``).  Here the ops are always registered (pytest-npugraph's op library), so loading
cannot fail (``NNAL_EX`` is None) and registering binds the same names the package already answers.
"""
from functools import lru_cache, wraps
from itertools import chain

import torch

import torch_npu
from pytest_npugraph.runtime.ops import _generated

API_LIST = list(_generated.ATB_TOP_LEVEL)
ATB_API_LIST = list(_generated.ATB_MODULE)
ATB_MODULE_NAME = "atb"
ATB_MODULE = torch_npu.atb
NNAL_EX = None
GLOBAL_E = None


def _patch_atb_ops():
    for api_name in API_LIST:
        setattr(torch_npu, api_name, getattr(torch.ops.atb, api_name))
    for api_name in ATB_API_LIST:
        setattr(ATB_MODULE, api_name, getattr(torch.ops.atb, api_name))


@lru_cache(None)
def _register_atb_extensions():
    if NNAL_EX is not None:
        raise NNAL_EX from GLOBAL_E
    _patch_atb_ops()


def lazy_load_atb_so(api_func):
    @wraps(api_func)
    def wrapper(*args, **kwargs):
        _register_atb_extensions()
        return api_func(*args, **kwargs)
    return wrapper


def create_lazy_atb_function(api_name):
    @lazy_load_atb_so
    def generated_function(*args, **kwargs):
        return getattr(torch.ops.atb, api_name)(*args, **kwargs)
    generated_function.__name__ = api_name
    return generated_function


for _name in chain(API_LIST, ATB_API_LIST):
    globals()[_name] = create_lazy_atb_function(_name)
del _name
