"""Forward lowerings added for OpInfo coverage and MoE models, checked against PyTorch CPU
on cases OpInfo's samples do not reach: antialiased upsampling, fractional max pooling
with given window offsets, Bunch-Kaufman LDL with 2x2 pivots and zero pivots (real
symmetric and complex Hermitian), lstsq per
driver (rank-deficient too), grouped matmuls, tensor repeats, the chunked
linear_cross_entropy ops, multilabel_margin_loss rows ended early, searchsorted with
a scalar."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _util import assert_close, check_op, gen, needs, op_param, randn, to_cpu, to_tpu

pytestmark = pytest.mark.sweep(every=10)

aten = torch.ops.aten


@pytest.mark.parametrize("op", [aten._upsample_bilinear2d_aa.default, aten._upsample_bicubic2d_aa.default,
                                op_param("aten._upsample_lanczos2d_aa.default")])
@pytest.mark.parametrize("hw,out,align,scales", [
    ((8, 9), (3, 4), False, None), ((8, 9), (3, 4), True, None), ((5, 6), (11, 13), False, None),
    ((5, 6), (11, 13), True, None), ((10, 10), (4, 4), False, (0.4, 0.45)), ((7, 7), (7, 7), False, None),
    ((4, 4), (1, 1), True, None)])
def test_upsample_antialiased(mode, op, hw, out, align, scales):
    x = randn(2, 3, *hw)
    check_op(op, x, list(out), align, *(scales or (None, None)))


def test_interpolate_antialias_gradient(mode):
    x = randn(2, 3, 9, 8).requires_grad_()
    for m in ("bilinear", "bicubic"):
        y = F.interpolate(x, size=(4, 5), mode=m, antialias=True)
        (gx,) = torch.autograd.grad(y, x, randn(*y.shape, seed=1))
        xt = x.detach().to("tpu").requires_grad_()
        yt = F.interpolate(xt, size=(4, 5), mode=m, antialias=True)
        (gt,) = torch.autograd.grad(yt, xt, randn(*y.shape, seed=1).to("tpu"))
        torch.testing.assert_close(yt.cpu(), y.detach(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(gt.cpu(), gx, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("batched", [True, False])
def test_fractional_max_pool_given_samples(mode, nd, batched):
    f = F.fractional_max_pool2d if nd == 2 else F.fractional_max_pool3d
    shape = (2, 3) + ((9, 10) if nd == 2 else (5, 6, 7))
    k = (2, 3) if nd == 2 else (2, 2, 3)
    o = (4, 3) if nd == 2 else (3, 2, 3)
    for seed in range(4):
        x = randn(*shape, seed=seed)
        x[..., 1] = x[..., 0]  # ties: the first index wins
        if seed == 3:
            x[0, 0, 0, 0] = float("nan")  # NaNs: the last one in the window wins
            x[0, 1, 2] = float("nan")
        samples = torch.rand(2, 3, nd, generator=gen(seed + 10))
        if not batched:
            x, samples = x[0], samples[:1]
        v, i = f(x, k, output_size=o, return_indices=True, _random_samples=samples)
        xt = x.to("tpu").requires_grad_()
        vt, it = f(xt, k, output_size=o, return_indices=True, _random_samples=samples.to("tpu"))
        torch.testing.assert_close(vt.cpu(), v, equal_nan=True)
        assert torch.equal(it.cpu(), i)
        if seed != 3:
            xr = x.clone().requires_grad_()
            g = randn(*v.shape, seed=5)
            (gr,) = torch.autograd.grad(f(xr, k, output_size=o, _random_samples=samples), xr, g)
            (gt,) = torch.autograd.grad(vt, xt, g.to("tpu"))
            torch.testing.assert_close(gt.cpu(), gr)


def _ldl_cases():
    yield torch.tensor([[0.0, 1, 2], [1, 0, 3], [2, 3, 0]])  # forces a 2x2 pivot
    yield torch.tensor([[0.0, 0, 0], [0, 1, 2], [0, 2, 1]])  # a zero column: info = 1
    g = gen(3)
    for n in (1, 2, 4, 6, 7):
        m = torch.randn(3, n, n, generator=g)
        yield m + m.mT  # indefinite: mixed 1x1 / 2x2 pivots
    m = torch.randn(5, 5, generator=g)
    yield m @ m.T + torch.eye(5)  # positive definite: no pivoting


@pytest.mark.parametrize("case", range(8))
def test_ldl_factor_and_solve(mode, case):
    A = list(_ldl_cases())[case]
    LD, piv, info = check_op(lambda a: torch.linalg.ldl_factor_ex(a), A)
    if case == 0:
        assert (to_cpu(piv) < 0).any()
    if case == 1:
        assert int(to_cpu(info)) == 1
        return
    LDc, pivc, _ = torch.linalg.ldl_factor_ex(A)
    B = randn(*A.shape[:-1], 3, seed=4)
    check_op(lambda ld, p, b: torch.linalg.ldl_solve(ld, p, b), LDc, pivc, B, rtol=1e-4, atol=1e-4)


def _hermitian_ldl_cases():
    yield torch.tensor([[0.0, 1 + 1j, 2], [1 - 1j, 0, 3j], [2, -3j, 0]])  # a 2x2 pivot
    yield torch.tensor([[0.0, 0, 0], [0, 1, 2j], [0, -2j, 1]])  # a zero column: info = 1
    g = gen(5)
    for n in (1, 2, 5, 8):
        m = torch.randn(3, n, n, dtype=torch.complex64, generator=g)
        yield m + m.mH  # indefinite: mixed 1x1 / 2x2 pivots
    m = torch.randn(6, 6, dtype=torch.complex64, generator=g)
    yield m @ m.mH + torch.eye(6)  # positive definite
    m = torch.randn(4, 4, dtype=torch.complex64, generator=g)
    yield m + m.mH + 0.5j * torch.eye(4)  # an imaginary diagonal: hetrf reads its real part


@pytest.mark.parametrize("case", range(8))
def test_ldl_factor_and_solve_complex_hermitian(mode, case):
    # LAPACK's zhetrf/zhetrs (what PyTorch's CPU kernels call with hermitian=True): the
    # same pivots and LD, and a solve of A X = B with A = P L D L^H P^T.
    A = list(_hermitian_ldl_cases())[case]
    LD, piv, info = check_op(lambda a: torch.linalg.ldl_factor_ex(a, hermitian=True), A)
    if case == 0:
        assert (to_cpu(piv) < 0).any()
    if case == 1:
        assert int(to_cpu(info)) == 1
        return
    LDc, pivc, _ = torch.linalg.ldl_factor_ex(A, hermitian=True)
    B = torch.randn(*A.shape[:-1], 3, dtype=torch.complex64, generator=gen(6))
    check_op(lambda ld, p, b: torch.linalg.ldl_solve(ld, p, b, hermitian=True), LDc, pivc, B,
           rtol=1e-4, atol=1e-4)
    if case < 7:  # a Hermitian A: the solve solves it
        X = torch.linalg.ldl_solve(to_tpu(LDc), to_tpu(pivc), to_tpu(B), hermitian=True)
        assert_close(A @ to_cpu(X), B, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("driver", ["gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("m,n", [(5, 3), (3, 3), (2, 4)])
def test_lstsq_drivers(mode, driver, m, n):
    A = randn(2, m, n)
    B = randn(2, m, 2, seed=1)
    check_op(lambda a, b: tuple(torch.linalg.lstsq(a, b, driver=driver)), A, B, rtol=1e-3, atol=1e-4)
    check_op(lambda a, b: tuple(torch.linalg.lstsq(a, b, driver=driver)), A, B[..., 0],
           rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("driver", ["gelsy", "gelsd", "gelss"])
def test_lstsq_rank_deficient(mode, driver):
    A = randn(6, 3)
    A[:, 2] = A[:, 0] + A[:, 1]  # rank 2: gelsd/gelss return no residuals
    B = randn(6, 2, seed=1)
    sol, res, rank, sv = check_op(lambda a, b: tuple(torch.linalg.lstsq(a, b, driver=driver)), A, B,
                                rtol=1e-3, atol=1e-4)
    assert int(to_cpu(rank)) == 2 and to_cpu(res).numel() == 0


def test_grouped_mm_layouts_and_gradients(mode):
    dt = torch.bfloat16
    offs = torch.tensor([2, 3, 6], dtype=torch.int32)
    a, b = randn(6, 8, dtype=dt), randn(3, 8, 8, seed=1, dtype=dt)
    check_op(torch._grouped_mm, a, b, offs)
    check_op(torch._grouped_mm, randn(4, 16, dtype=dt), randn(16, 8, seed=1, dtype=dt),
           torch.tensor([8, 16], dtype=torch.int32))
    check_op(torch._grouped_mm, randn(2, 4, 8, dtype=dt), randn(8, 16, seed=1, dtype=dt),
           torch.tensor([8, 16], dtype=torch.int32))
    check_op(torch._grouped_mm, randn(2, 4, 8, dtype=dt), randn(2, 8, 8, seed=1, dtype=dt))
    # gradients against a float32 loop over the groups (CPU's own backward needs CUDA strides)
    at, bt = a.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
    g = randn(6, 8, seed=2, dtype=dt)
    torch._grouped_mm(at, bt, offs.to("tpu")).backward(g.to("tpu"))
    af, bf = a.float().requires_grad_(), b.float().requires_grad_()
    torch.cat([af[0:2] @ bf[0], af[2:3] @ bf[1], af[3:6] @ bf[2]]).backward(g.float())
    torch.testing.assert_close(at.grad.cpu().float(), af.grad, rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(bt.grad.cpu().float(), bf.grad, rtol=2e-2, atol=5e-2)


def test_repeat_interleave_tensor_repeats(mode):
    x = randn(4, 3)
    r = torch.tensor([1, 0, 3, 2])
    check_op(lambda x, r: torch.repeat_interleave(x, r, dim=0), x, r)
    check_op(lambda r: torch.repeat_interleave(r), r)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias", [False, True])
@needs("linear_cross_entropy")
def test_linear_cross_entropy_chunked(mode, reduction, bias):
    x = randn(7, 5).requires_grad_()
    w = randn(6, 5, seed=1).requires_grad_()
    b = randn(6, seed=2).requires_grad_() if bias else None
    t = torch.tensor([0, 5, -100, 2, 2, 1, 3])
    cw = torch.rand(6, generator=gen(3))
    opts = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=3, allow_retain_graph=True)

    def run(x, w, b, t, cw):
        return F.linear_cross_entropy(x, w, t, linear_bias=b, weight=cw, reduction=reduction, options=opts)

    ins = [v for v in (x, w, b) if v is not None]
    out = run(x, w, b, t, cw)
    cot = randn(*out.shape, seed=4)
    ref = torch.autograd.grad(out, ins, cot)
    tx, tw = x.detach().to("tpu").requires_grad_(), w.detach().to("tpu").requires_grad_()
    tb = b.detach().to("tpu").requires_grad_() if bias else None
    tout = run(tx, tw, tb, t.to("tpu"), cw.to("tpu"))
    got = torch.autograd.grad(tout, [v for v in (tx, tw, tb) if v is not None], cot.to("tpu"))
    torch.testing.assert_close(tout.cpu(), out.detach(), rtol=1e-4, atol=1e-5)
    for a, e in zip(got, ref):
        torch.testing.assert_close(a.cpu(), e, rtol=1e-4, atol=1e-5)


def test_searchsorted_scalar_and_empty(mode):
    seq = torch.tensor([1.0, 2.0, 2.0, 5.0])
    for side in ("left", "right"):
        check_op(lambda s, side=side: torch.searchsorted(s, 2.0, side=side), seq)
    check_op(lambda s, v: torch.searchsorted(s, v), torch.empty(0), torch.tensor([1.0, 3.0]))
    check_op(lambda s, v: torch.searchsorted(s, v), torch.empty(2, 0), randn(2, 3))
