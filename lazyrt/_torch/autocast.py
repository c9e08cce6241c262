"""``torch.autocast(device_type="tpu", dtype=torch.bfloat16)``.

PyTorch ships autocast kernels for CUDA/CPU/XPU but none for PrivateUse1, so
every op under autocast on tpu failed. lazyrt registers the same policy as CUDA's
(``aten/src/ATen/autocast_mode.cpp``), for the AutocastPrivateUse1 key:
  * matmul/conv-like ops run in the autocast dtype (fp32 inputs cast down);
  * numerically sensitive ops run in float32 (low-precision inputs cast up);
  * every other op falls through unchanged.
"""
from __future__ import annotations

import torch

_KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

LOWER_PRECISION = [
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linear", "addbmm",
    "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
]
FP32 = [
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "frobenius_norm.dim", "nuclear_norm", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_linear1d",
    "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d",
    "cross_entropy_loss", "softmax.int", "log_softmax.int", "cumsum", "cumprod", "prod",
    "sum", "norm.Scalar", "norm.ScalarOpt_dim",
]

_LIBS: list = []


def _cast(x, dtype, want):
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() and x.dtype != torch.float64 and x.dtype != dtype and want(x):
            return x.to(dtype)
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(v, dtype, want) for v in x)
    return x


def _kernel(op, to_low: bool):
    def kernel(*args, **kwargs):
        if to_low:
            dtype = torch.get_autocast_dtype("tpu")
            want = lambda t: t.dtype == torch.float32
        else:
            dtype = torch.float32
            want = lambda t: t.dtype in (torch.float16, torch.bfloat16)
        args = _cast(args, dtype, want)
        kwargs = {k: _cast(v, dtype, want) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)

    return kernel


def _resolve(name):
    packet, _, ov = name.partition(".")
    p = getattr(torch.ops.aten, packet, None)
    if p is None:
        return None
    return getattr(p, ov or "default", None)


def register() -> None:
    if _LIBS:
        return
    fall = torch.library.Library("_", "IMPL")
    fall.fallback(torch.library.fallthrough_kernel, _KEY)
    lib = torch.library.Library("aten", "IMPL")
    for names, low in ((LOWER_PRECISION, True), (FP32, False)):
        for name in names:
            op = _resolve(name)
            if op is None:
                continue
            try:
                lib.impl(name, _kernel(op, low), _KEY)
            except RuntimeError:
                continue
    _LIBS.extend([fall, lib])
