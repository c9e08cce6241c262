"""Backward ops derived from their forward (lazyrt/lowering/derived_backward.py).

Each derived backward ATen op is called directly on tpu and on the CPU with the same
arguments (output_mask variants included) and must match PyTorch's CPU kernel; the
layers that reach them are checked end to end against CPU autograd, in strict and defer.

The default run samples each sweep (``@pytest.mark.sweep``: one case in 4, one in 10 of the
four largest, each case in one mode); ``-m slow`` runs the rest.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _util import check_op, gen, grad_check, randn, to_cpu

from lazyrt.lowering import LOWERINGS, derived_backward
from lazyrt.lowering._traced import jax_fn

aten = torch.ops.aten

pytestmark = pytest.mark.sweep(every=4)


# ---- the backward ops, called directly ----------------------------------------------------------


@pytest.mark.sweep(every=10)
@pytest.mark.parametrize("name,nd,sizes", [
    ("upsample_linear1d", 1, [(2, 3, 5), (11,)]),
    ("upsample_bilinear2d", 2, [(2, 3, 5, 6), (7, 9)]),
    ("upsample_bicubic2d", 2, [(2, 3, 5, 6), (3, 11)]),
    ("upsample_trilinear3d", 3, [(1, 2, 2, 3, 4), (3, 4, 5)]),
    ("_upsample_bilinear2d_aa", 2, [(2, 3, 8, 9), (3, 4)]),
    ("_upsample_bicubic2d_aa", 2, [(2, 3, 8, 9), (5, 13)]),
])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("scaled", [False, True])
def test_upsample_backward(mode, name, nd, sizes, align_corners, scaled):
    in_size, out_size = sizes
    scales = [1.7] * nd if scaled and not align_corners else [None] * nd
    g = randn(*in_size[:2], *out_size)
    op = getattr(aten, f"{name}_backward").default
    check_op(op, g, list(out_size), list(in_size), align_corners, *scales)


@pytest.mark.sweep(every=10)
@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("interp,padding", [(0, 0), (0, 1), (1, 2), (2, 2), (2, 0)])
@pytest.mark.parametrize("mask", [[True, True], [True, False], [False, True]])
def test_grid_sampler_backward_output_mask(mode, nd, interp, padding, mask):
    if nd == 3 and interp == 2:
        pytest.skip("bicubic is 2-D only")
    x = randn(2, 3, *([4, 5, 6][3 - nd:]))
    grid = torch.rand(2, *([3, 2, 4][3 - nd:]), nd, generator=gen(1)) * 2.4 - 1.2
    g = randn(2, 3, *grid.shape[1:-1], seed=2)
    op = aten.grid_sampler_2d_backward.default if nd == 2 else aten.grid_sampler_3d_backward.default
    for align in (False, True):
        # None where CPU returns None (its grid gradient is computed whatever the mask)
        check_op(op, g, x, grid, interp, padding, align, mask, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("nd,pad", [(1, [2, 3]), (2, [2, 3, 1, 0]), (3, [1, 0, 2, 1, 1, 1])])
def test_replication_pad_backward(mode, nd, pad):
    x = randn(2, 3, *[3, 4, 5][:nd])
    out = getattr(aten, f"replication_pad{nd}d")(x, pad)
    g = randn(*out.shape, seed=1)
    check_op(getattr(aten, f"replication_pad{nd}d_backward").default, g, x, pad)


@pytest.mark.parametrize("op", [aten.softshrink_backward.default, aten.hardshrink_backward.default])
@pytest.mark.parametrize("lambd", [0.0, 0.5, 1.3])
def test_shrink_backward(mode, op, lambd):
    x = randn(4, 7)
    x[0, :3] = torch.tensor([lambd, -lambd, 0.0])  # at the kinks
    check_op(op, randn(4, 7, seed=1), x, lambd)


@pytest.mark.sweep(every=10)
@pytest.mark.parametrize("p,margin", [(1, 1.0), (2, 0.7)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_multi_margin_loss_backward(mode, p, margin, weighted, reduction):
    x = randn(5, 4)
    t = torch.tensor([1, 0, 3, 3, 2])
    w = torch.rand(4, generator=gen(3)) if weighted else None
    g = randn(5, seed=1) if reduction == 0 else randn(seed=1)
    check_op(aten.multi_margin_loss_backward.default, g, x, t, p, margin, w, reduction)


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("batched", [True, False])
def test_multilabel_margin_loss(mode, reduction, batched):
    if reduction == 0 and not batched:
        pytest.xfail("dispatcher core: output shapes come from PyTorch's meta kernel, which gives "
                     "[1] for an unbatched reduction='none' loss where the CPU kernel gives []")
    x = randn(3, 4)
    t = torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1], [0, -1, 1, 2]])  # rows end early at -1
    if not batched:
        x, t = x[1], t[1]
    # the forward (PyTorch's decomposition miscounts rows that end early; lazyrt's lowering
    # follows the CPU kernel)
    loss, is_target = check_op(aten.multilabel_margin_loss_forward.default, x, t, reduction)
    g = randn(*loss.shape, seed=1)
    check_op(aten.multilabel_margin_loss_backward.default, g, x, t, reduction, to_cpu(is_target))


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0, float("inf")])
def test_cdist_backward(mode, p):
    x1, x2 = randn(2, 4, 3), randn(2, 5, 3, seed=1)
    x2[0, 0] = x1[0, 1]  # a zero distance
    d = aten._cdist_forward(x1, x2, p, None)
    check_op(aten._cdist_backward.default, randn(*d.shape, seed=2), x1, x2, p, d,
              rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, float("inf")])
def test_pdist_backward(mode, p):
    x = randn(5, 3)
    d = aten._pdist_forward(x, p)
    check_op(aten._pdist_backward.default, randn(*d.shape, seed=1), x, p, d, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dim", [0, 2])  # PyTorch calls the fused op on the first/last dim only
def test_weight_norm_interface_backward(mode, dim):
    v = randn(4, 3, 2)
    gshape = [1, 1, 1]
    gshape[dim] = v.shape[dim]
    g = torch.rand(gshape, generator=gen(1)) + 0.5
    w, norms = aten._weight_norm_interface(v, g, dim)
    out = check_op(aten._weight_norm_interface_backward.default, randn(*w.shape, seed=2), v, g,
                    norms, dim)
    assert len(out) == 2


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("tensor_lengths", [False, True])
def test_ctc_loss_backward(mode, zero_infinity, tensor_lengths):
    T, N, C = 12, 3, 5
    lp = randn(T, N, C).log_softmax(2)
    targets = torch.randint(1, C, (N, 4), generator=gen(1))
    il, tl = [12, 10, 9], [4, 3, 2]
    if zero_infinity:
        il[2] = 1  # an impossible alignment: infinite loss, zeroed
    if tensor_lengths:
        il, tl = torch.tensor(il), torch.tensor(tl)
        nll, alpha = aten._ctc_loss.Tensor(lp, targets, il, tl, 0, zero_infinity)
        op = aten._ctc_loss_backward.Tensor
    else:
        nll, alpha = aten._ctc_loss(lp, targets, il, tl, 0, zero_infinity)
        op = aten._ctc_loss_backward.default
    check_op(op, randn(N, seed=2), lp, targets, il, tl, nll, alpha, 0, zero_infinity,
              rtol=1e-4, atol=1e-5)


def test_masked_scatter_backward(mode):
    mask = torch.rand(3, 4, generator=gen(1)) > 0.5
    g = randn(3, 4)
    check_op(aten.masked_scatter_backward.default, g, mask, [5, 4])
    check_op(aten.masked_scatter_backward.default, g, mask, [20])


@pytest.mark.sweep(every=10)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("offsets", [False, True])
def test_segment_reduce_backward(mode, reduce, axis, offsets):
    data = randn(6, 6)
    data[0, 0] = data[1, 0]  # a tie (max/min)
    data[3, 2] = 0.0  # a zero (prod)
    lengths = torch.tensor([2, 0, 3, 1])
    offs = torch.tensor([0, 2, 2, 5, 6])
    if axis == 1:  # the reduced axis is the last dim of lengths/offsets
        lengths, offs = lengths.expand(6, 4).contiguous(), offs.expand(6, 5).contiguous()
    kw = {"offsets": offs} if offsets else {"lengths": lengths}
    out = aten.segment_reduce(data, reduce, axis=axis, unsafe=False, **kw)
    g = randn(*out.shape, seed=1)
    check_op(aten._segment_reduce_backward.default, g, out, data, reduce, axis=axis, **kw)


def _derived_grad_check(fn, *inputs, rtol=1e-4, atol=1e-5):
    grad_check(fn, *inputs, seed=7, rtol=rtol, atol=atol)


# ---- the layers that reach them, against CPU autograd ---------------------------------------------


LAYERS = {
    "interpolate_bilinear": (lambda x: F.interpolate(x, size=(7, 9), mode="bilinear"), [(2, 3, 5, 6)]),
    "interpolate_bicubic_ac": (lambda x: F.interpolate(x, scale_factor=1.5, mode="bicubic",
                                                       align_corners=True), [(2, 3, 5, 6)]),
    "interpolate_antialias": (lambda x: F.interpolate(x, size=(3, 4), mode="bilinear",
                                                      antialias=True), [(2, 3, 8, 9)]),
    "interpolate_trilinear": (lambda x: F.interpolate(x, size=(3, 4, 5), mode="trilinear"),
                              [(1, 2, 2, 3, 4)]),
    "grid_sample": (lambda x, g: F.grid_sample(x, g.tanh() * 1.1, align_corners=False),
                    [(2, 3, 5, 6), (2, 4, 4, 2)]),
    "pad_replicate": (lambda x: F.pad(x, (2, 3, 1, 0), mode="replicate"), [(2, 3, 5, 6)]),
    "softshrink": (lambda x: F.softshrink(x, 0.5), [(4, 7)]),
    "cdist": (lambda a, b: torch.cdist(a, b), [(2, 4, 3), (2, 5, 3)]),
    "pdist": (lambda a: F.pdist(a), [(5, 3)]),
    "weight_norm": (lambda v, g: torch._weight_norm(v, g, 0), [(4, 3, 2), (4, 1, 1)]),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_gradients(mode, name):
    fn, shapes = LAYERS[name]
    _derived_grad_check(fn, *[randn(*s, seed=i) for i, s in enumerate(shapes)], rtol=1e-4, atol=1e-4)


def test_ctc_loss_gradient(mode):
    lp = randn(12, 3, 5).log_softmax(2)
    tg = torch.randint(1, 5, (3, 4), generator=gen(1))
    _derived_grad_check(lambda x: F.ctc_loss(x.log_softmax(2), tg.to(x.device), [12, 10, 9], [4, 3, 2]), lp)


# ---- the mechanism --------------------------------------------------------------------------------


def test_every_declared_backward_is_registered_and_named():
    assert len(derived_backward.BACKWARDS) >= 20
    for op, spec in derived_backward.BACKWARDS.items():
        low = LOWERINGS[op]
        name = op._schema.name.split("::")[-1]
        if op._overloadname != "default":
            name += "_" + op._overloadname
        if low.fn.__module__ == derived_backward.__name__:  # not hand-written
            assert low.fn.__name__ == low.fn.__qualname__ == name
            assert low.fn.derived_from is spec.forward
            assert getattr(derived_backward, name) is low.fn
            # derived after the forward's own lowering was registered (import order)
            fwd = LOWERINGS.get(spec.forward)
            if fwd is not None:
                assert low.data_dependent == fwd.data_dependent, op


def test_hand_written_backward_is_kept():
    op = aten.upsample_nearest2d_backward.default
    before = LOWERINGS[op]
    try:
        derived_backward.derive(op, aten.upsample_nearest2d.default, ("self",),
                                self=derived_backward.Zeros("input_size"))
        assert LOWERINGS[op] is before
    finally:
        derived_backward.BACKWARDS.pop(op, None)
        vars(derived_backward).pop("upsample_nearest2d_backward", None)


def test_declaration_is_checked_against_the_schemas():
    with pytest.raises(ValueError, match="not an argument"):
        derived_backward._make(aten.softshrink_backward.default,
                               derived_backward.Backward(aten.softshrink.default, ("x",)))
    with pytest.raises(ValueError, match="cotangents"):
        derived_backward._make(aten.softshrink_backward.default,
                               derived_backward.Backward(aten.softshrink.default, ("self",),
                                                         ("grad_output", None)))
    with pytest.raises(ValueError, match="no source"):
        derived_backward._make(aten.masked_scatter_backward.default,
                               derived_backward.Backward(aten.masked_scatter.default, ("source",)))


def test_decomposed_forward_runs_on_lowerings():
    import jax
    import jax.numpy as jnp
    import numpy as np

    f = jax_fn(aten.upsample_bicubic2d.default)
    assert f.__name__ == "upsample_bicubic2d_decomposed"
    x = randn(2, 3, 4, 5)
    with jax.enable_x64(True):
        got = f(jnp.asarray(x.numpy()), [7, 3], False, None, None)
    torch.testing.assert_close(torch.from_numpy(np.asarray(got)),
                               aten.upsample_bicubic2d(x, [7, 3], False), rtol=1e-5, atol=1e-5)
    assert jax_fn(aten._cdist_forward.default) is LOWERINGS[aten._cdist_forward.default].fn
