"""``torch.autocast("npu")``: the ``AutocastPrivateUse1`` dispatch key's kernels.

torch_npu registers C++ autocast kernels for the npu key; without any, every op inside an autocast
region fails in the dispatcher.  Here most ops fall through (run in their own dtype), matmul-like
ops run in the autocast dtype (float16 unless ``dtype=`` says otherwise) and precision-sensitive
ops in float32, casting floating NPU arguments as torch's CUDA autocast policy does.  The casts are
ordinary ops, so they appear in the trace as the real ones do on the device.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

# torch's CUDA autocast lists (aten/src/ATen/autocast_mode.cpp), which torch_npu follows for aten ops
LOWER_PRECISION = (
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d.input",
    "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
    "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "scaled_dot_product_attention",
)
FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp",
    # torch's "fp32_set_opt_dtype" ops: a lower-precision input runs (and returns) in float32
    "prod", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm", "sum",
)
_KEY = "AutocastPrivateUse1"
_libraries: list = []


def _eligible(x) -> bool:
    return (isinstance(x, torch.Tensor) and x.device.type == "npu" and x.is_floating_point()
            and x.dtype is not torch.float64)


def _kernel(op, target):
    """Cast the floating NPU arguments to ``target()`` and run ``op`` below the autocast key."""
    excluded = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, _KEY))

    def kernel(*args, **kwargs):
        dtype = target()
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            def cast(x):
                return x.to(dtype) if _eligible(x) and x.dtype != dtype else x
            return op(*tree_map(cast, args), **tree_map(cast, kwargs))
    return kernel


def _lower_precision():
    return torch.get_autocast_dtype("npu")


def _float32():
    return torch.float32


def install() -> None:
    """Register the kernels (once per process; the npu key is only active inside an autocast region)."""
    if _libraries:
        return
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(torch.library.fallthrough_kernel, dispatch_key=_KEY)
    lib = torch.library.Library("aten", "IMPL")
    for names, target in ((LOWER_PRECISION, _lower_precision), (FLOAT32, _float32)):
        for name in names:
            base, _, overload = name.partition(".")
            packet = getattr(torch.ops.aten, base, None)
            if packet is None:
                continue
            overloads = [overload] if overload else packet.overloads()
            for o in overloads:
                op = getattr(packet, o)
                lib.impl(f"{base}.{o}" if o != "default" else base, _kernel(op, target), _KEY)
    _libraries.extend((fallback, lib))
