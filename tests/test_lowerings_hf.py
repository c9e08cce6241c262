"""Lowerings added or fixed for the Hugging Face model suite (``test_hf_models.py``),
each checked against PyTorch CPU eager (values and gradients) in strict and defer mode."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _util import assert_close, gen, grad_check

# ---- aten._grouped_mm (MoE experts in transformers >= 5: Mixtral, Qwen2/3-MoE, OLMoE) ------
# PyTorch's CPU kernel needs 16-byte aligned strides: sizes are multiples of 4 floats.
# PyTorch's meta kernel accepts only bfloat16 (the CUDA rule); lazyrt takes this op's output
# shapes from its lowering (_plan._META_STRICTER_THAN_CPU), so float32 runs as on the CPU.


def _np(t):
    return jnp.asarray(t.detach().numpy())


def test_grouped_mm_bfloat16_on_tpu(mode):
    # bfloat16 passes the meta kernel: the whole path (forward and backward) runs on tpu.
    a = torch.randn(12, 8, generator=gen(21)).bfloat16()
    b = torch.randn(3, 8, 8, generator=gen(22)).bfloat16()
    offs = torch.tensor([5, 5, 12], dtype=torch.int32)
    out = {}
    for dev in ("cpu", "tpu"):
        a_, b_ = a.clone().to(dev).requires_grad_(), b.clone().to(dev).requires_grad_()
        y = torch._grouped_mm(a_, b_, offs.to(dev))
        (y.float() * torch.randn(12, 8, generator=gen(23)).to(dev)).sum().backward()
        out[dev] = [y.detach(), a_.grad, b_.grad]
    assert [t.dtype for t in out["tpu"]] == [torch.bfloat16] * 3
    assert_close(out["tpu"], out["cpu"], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("case", ["2d3d", "2d3d_strided", "2d2d", "3d2d", "3d3d"])
def test_grouped_mm_lowering_matches_cpu(case):
    """The lowering as a JAX function, and its jax.vjp, against PyTorch CPU (+ autograd)."""
    from lazyrt.lowering.linalg import _grouped_mm

    g = gen(20)
    if case.startswith("2d3d"):
        a, b = torch.randn(12, 8, generator=g), torch.randn(3, 8, 4, generator=g)
        if case.endswith("strided"):
            b = torch.randn(3, 4, 8, generator=g).transpose(-2, -1)
        offs = torch.tensor([5, 5, 12], dtype=torch.int32)
    elif case == "2d2d":
        a, b = torch.randn(4, 12, generator=g), torch.randn(12, 8, generator=g)
        offs = torch.tensor([4, 4, 12], dtype=torch.int32)
    elif case == "3d2d":
        a, b = torch.randn(3, 4, 8, generator=g), torch.randn(8, 12, generator=g)
        offs = torch.tensor([4, 8, 12], dtype=torch.int32)
    else:
        a, b, offs = torch.randn(3, 4, 8, generator=g), torch.randn(3, 8, 4, generator=g), None
    ref = torch._grouped_mm(a, b, offs)
    joffs = None if offs is None else _np(offs)
    got = _grouped_mm(_np(a), _np(b), joffs)
    assert got.shape == tuple(ref.shape) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), ref.numpy(), rtol=1e-5, atol=1e-5)
    if case in ("2d3d", "2d3d_strided"):  # what the experts' backward needs
        w = torch.randn(ref.shape, generator=g)
        a_, b_ = a.clone().requires_grad_(), b.detach().clone().requires_grad_()
        (torch._grouped_mm(a_, b_, offs) * w).sum().backward()
        _, vjp = jax.vjp(lambda x, y: _grouped_mm(x, y, joffs), _np(a), _np(b))
        da, db = vjp(_np(w))
        np.testing.assert_allclose(np.asarray(da), a_.grad.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(db), b_.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_grouped_mm_rows_by_expert(mode):
    # (tokens, K) x (experts, K, N), tokens sorted by expert; an empty group in the middle.
    a = torch.randn(12, 8, generator=gen(1))
    b = torch.randn(3, 8, 4, generator=gen(2))
    offs = torch.tensor([5, 5, 12], dtype=torch.int32)
    grad_check(lambda a, b: torch._grouped_mm(a, b, offs.to(a.device)), a, b)


def test_grouped_mm_transposed_weight_like_transformers(mode):
    # transformers passes weight.transpose(-2, -1) of (experts, N, K): a strided view.
    a = torch.randn(8, 8, generator=gen(3))
    w = torch.randn(4, 12, 8, generator=gen(4))
    offs = torch.tensor([2, 3, 7, 8], dtype=torch.int32)
    grad_check(lambda a, w: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs.to(a.device)),
                a, w)


def test_grouped_mm_contracted_dim_grouped(mode):
    # 2-D x 2-D: groups along K (what the expert weights' gradient is).
    a = torch.randn(4, 12, generator=gen(5))
    b = torch.randn(12, 8, generator=gen(6))
    offs = torch.tensor([4, 4, 12], dtype=torch.int32)
    got = torch._grouped_mm(a.to("tpu"), b.to("tpu"), offs.to("tpu"))
    assert_close(got, torch._grouped_mm(a, b, offs))


def test_grouped_mm_columns_grouped_and_batched(mode):
    a = torch.randn(3, 4, 8, generator=gen(7))
    b = torch.randn(8, 12, generator=gen(8))
    offs = torch.tensor([4, 8, 12], dtype=torch.int32)
    got = torch._grouped_mm(a.to("tpu"), b.to("tpu"), offs.to("tpu"))
    assert_close(got, torch._grouped_mm(a, b, offs))
    b3 = torch.randn(3, 8, 4, generator=gen(9))
    assert_close(torch._grouped_mm(a.to("tpu"), b3.to("tpu")), torch._grouped_mm(a, b3))


def test_grouped_mm_rows_past_last_offset_are_zero(mode):
    # PyTorch leaves such rows unwritten (garbage); lazyrt gives zeros, the rest matches.
    a = torch.randn(8, 4, generator=gen(10))
    b = torch.randn(2, 4, 4, generator=gen(11))
    offs = torch.tensor([3, 6], dtype=torch.int32)
    got = torch._grouped_mm(a.to("tpu"), b.to("tpu"), offs.to("tpu")).cpu()
    assert_close(got[:6], torch._grouped_mm(a, b, offs)[:6])
    assert torch.equal(got[6:], torch.zeros(2, 4))


# ---- aten.convolution with one-element stride/padding/dilation lists ----------------------


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_convolution_valid_padding_string(mode, nd):
    # padding="valid" (SigLIP's patch embedding) reaches aten.convolution as padding=[0].
    x = torch.randn((2, 3) + (9,) * nd, generator=gen(12))
    w = torch.randn((4, 3) + (3,) * nd, generator=gen(13))
    bias = torch.randn(4, generator=gen(14))
    conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    grad_check(lambda x, w, b: conv(x, w, b, stride=2, padding="valid"), x, w, bias)


def test_convolution_one_element_lists(mode):
    x = torch.randn(2, 2, 10, 10, generator=gen(15))
    w = torch.randn(4, 2, 3, 3, generator=gen(16))
    op = torch.ops.aten.convolution.default
    grad_check(lambda x, w: op(x, w, None, [2], [1], [2], False, [0], 1), x, w)
    wt = torch.randn(2, 4, 3, 3, generator=gen(17))
    grad_check(lambda x, w: op(x, w, None, [2], [1], [1], True, [1], 1), x, wt)
