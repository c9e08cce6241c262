"""PyTorch semantics on tpu, checked against CPU eager: views and in-place ops,
dtype promotion, RNG, errors at the op, device API, modes, printing."""
from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from _util import assert_close

import lazyrt


def _both(fn, *inputs):
    """Run ``fn`` on CPU copies and on tpu copies of ``inputs``; compare everything."""
    cpu = [x.clone() for x in inputs]
    tpu = [x.clone().to("tpu") for x in inputs]
    out_c = fn(*cpu)
    out_t = fn(*tpu)
    assert_close(out_t, out_c)
    for a, b in zip(tpu, cpu):
        assert_close(a, b)


# ---- views and in-place ----------------------------------------------------------------


def test_mutation_through_slices_and_views(mode):
    def f(x):
        x[1:3, ::2] = 7.0
        v = x.t()
        v[0].mul_(2)
        w = x.view(-1)[3:9]
        w.add_(1)
        x.select(1, 2).fill_(-1)
        return x.sum(0)

    _both(f, torch.randn(5, 4))


def test_views_of_views_and_base_updates(mode):
    def f(x):
        a = x[1:]
        b = a[:, 1:3]
        c = b.transpose(0, 1)
        x.mul_(3)  # base change is seen by every view
        c[0, 0] = 100.0
        d = x.unsqueeze(0).expand(2, -1, -1)
        return a.clone(), b.clone(), c.contiguous(), d.sum(0)

    _both(f, torch.randn(4, 5))


def test_diagonal_and_as_strided_writes(mode):
    def f(x):
        x.diagonal().zero_()
        x.as_strided((2, 2), (1, 3), 1).add_(5)
        torch.diagonal(x, 1).copy_(torch.arange(3.0, device=x.device))
        return x

    _both(f, torch.randn(4, 4))


def _layout(t):
    return tuple(t.shape), t.stride(), t.storage_offset()


def test_resize_keeps_storage_semantics(mode):
    """``resize_`` reads the storage as C-contiguous at the tensor's offset: shrinking
    keeps aliasing (writes are seen by the other views), growing keeps the old elements
    first, and the sizes, strides and offsets are PyTorch's."""
    def f(x):
        row = x[1]
        y = x.clone()[1:3]
        x.resize_(10)
        x.mul_(2)  # seen through ``row`` (same storage)
        y.resize_(3, 30)  # needs 25 + 90 elements of a 125-element storage: fits
        z = torch.arange(6.0, device=x.device).view(2, 3).t()
        z.resize_(3, 2)  # a transposed view: its storage, row-major
        w = torch.arange(4.0, device=x.device)
        w.resize_(6)  # grows
        v = torch.ones(2, 3, 4, 5, device=x.device)
        v.resize_(2, 3, 4, 5, memory_format=torch.channels_last)
        layouts = [_layout(t) for t in (x, row, y, z, w, v)]
        return x, row.clone(), y[:, :20], z, w[:4], layouts

    _both(f, torch.randn(5, 5, 5))


def test_resize_as_and_errors(mode):
    x = torch.randn(2, 3, device="tpu")
    torch.resize_as_(x, torch.empty(3, 2, device="tpu"))
    assert x.shape == (3, 2) and x.stride() == (2, 1)
    g = torch.ones(2, device="tpu", requires_grad=True)
    with pytest.raises(RuntimeError, match="cannot resize variables that require grad"):
        g.resize_(4)
    with pytest.raises(RuntimeError, match="out of bounds for storage of size 40"):
        torch.ones(10, device="tpu").as_strided((2, 2), (1, 2), 10)


def test_set_shares_the_source_storage(mode):
    def f(x):
        y = torch.zeros(3, device=x.device)
        y.set_(x)
        y.add_(1)  # seen through x
        w = torch.ones(2, device=x.device)
        w.set_()
        return y, _layout(y), _layout(w)

    _both(f, torch.randn(2, 3))
    x = torch.randn(3, device="tpu")
    y = torch.zeros(1, device="tpu").set_(x)
    assert y.is_set_to(x) and not y.is_set_to(x.clone()) and not x[1:].is_set_to(x)
    with pytest.raises(RuntimeError, match="Could not set tensor of type double to a tensor of type float"):
        torch.zeros(2, device="tpu").set_(torch.zeros(2, dtype=torch.float64, device="tpu"))


def test_out_tensor_of_another_shape_is_resized(mode):
    """PyTorch's ``resize_output``: an out= tensor of another shape is resized (warning
    when it had elements), whatever path the op takes."""
    a, b = torch.randn(3, 4), torch.randn(4)
    for dev in ("cpu", "tpu"):
        empty = torch.empty(0, device=dev)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning for an empty out
            torch.add(a.to(dev), b.to(dev), out=empty)
        small = torch.ones(2, device=dev)
        with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
            torch.mul(a.to(dev), 2, out=small)
        vals, idx = torch.empty(1, device=dev), torch.empty(0, dtype=torch.long, device=dev)
        torch.max(a.to(dev), 1, out=(vals, idx))
        if dev == "cpu":
            ref = (empty, small, vals, idx)
        else:
            got = (empty, small, vals, idx)
    for t, r in zip(got, ref):
        assert t.stride() == r.stride()
        assert_close(t, r)


def test_split_unbind_chunk_views(mode):
    def f(x):
        a, b = x.split([1, 3], dim=1)
        b.mul_(-1)
        for i, row in enumerate(x.unbind(0)):
            row.add_(i)
        x.chunk(2, dim=0)[1].fill_(0.5)
        return x

    _both(f, torch.randn(4, 4))


def test_index_put_masked_fill_copy(mode):
    def f(x, idx):
        x[idx] = -3.0
        x[x > 1] = 1.0
        x.masked_fill_(x < -2, 0.0)
        y = torch.zeros_like(x)
        y.copy_(x * 2)
        x.index_put_((idx,), torch.ones(idx.shape[0], x.shape[1], device=x.device), accumulate=True)
        return y

    _both(f, torch.randn(6, 3), torch.tensor([0, 2, 2]))


def test_detach_and_data_share_storage(mode):
    x = torch.randn(3, device="tpu", requires_grad=True)
    d = x.detach()
    d.add_(1)
    with torch.no_grad():
        x.data.mul_(2)
    assert torch.equal(x.detach().cpu(), d.cpu())
    assert x.requires_grad and not d.requires_grad
    x.data = torch.zeros(3, device="tpu")
    assert_close(x.detach(), torch.zeros(3))
    assert x.requires_grad


def test_inplace_on_leaf_requiring_grad_raises_like_pytorch():
    x = torch.randn(3, device="tpu", requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        x.add_(1)


# ---- dtypes ---------------------------------------------------------------------------------

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool]


@pytest.mark.sweep(every=3)
@pytest.mark.parametrize("a", DTYPES, ids=str)
@pytest.mark.parametrize("b", [torch.float32, torch.int64, torch.bool, torch.float16], ids=str)
def test_type_promotion(a, b):
    x = torch.arange(1, 7).reshape(2, 3).to(a)
    y = torch.arange(2, 8).reshape(2, 3).to(b)
    for fn in (torch.add, torch.mul, torch.maximum, torch.eq):
        assert_close(fn(x.to("tpu"), y.to("tpu")), fn(x, y))
    assert_close(x.to("tpu") * 2.5, x * 2.5)
    assert_close(x.to("tpu") + 3, x + 3)
    assert_close(x.to("tpu") / y.to("tpu"), x / y, rtol=1e-2, atol=1e-2)


def test_int64_and_float64_are_exact():
    big = torch.tensor([2**40 + 1, 2**41 + 3, -(2**50)], dtype=torch.int64)
    assert torch.equal(big.to("tpu").cumsum(0).cpu(), big.cumsum(0))
    assert (big.to("tpu") * 3).cpu().tolist() == (big * 3).tolist()
    d = torch.tensor([1 / 3, math.pi, 1e-300], dtype=torch.float64)
    assert torch.equal((d.to("tpu") * 7).cpu(), d * 7)
    idx = torch.tensor([5, 2**33], dtype=torch.int64)
    assert (idx.to("tpu") + 1).cpu().tolist() == [6, 2**33 + 1]


def test_user_jax_default_dtypes_untouched():
    import jax.numpy as jnp

    _ = torch.ones(3, dtype=torch.int64, device="tpu").sum().item()
    assert jnp.arange(3).dtype == jnp.int32
    assert jnp.ones(2).dtype == jnp.float32


# ---- RNG -----------------------------------------------------------------------------------------


def test_manual_seed_reproducible(mode):
    torch.manual_seed(123)
    a = torch.randn(100, device="tpu").cpu()
    d1 = F.dropout(torch.ones(100, device="tpu"), 0.5).cpu()
    torch.manual_seed(123)
    b = torch.randn(100, device="tpu").cpu()
    d2 = F.dropout(torch.ones(100, device="tpu"), 0.5).cpu()
    assert torch.equal(a, b) and torch.equal(d1, d2)
    c = torch.randn(100, device="tpu").cpu()
    assert not torch.equal(a, c)
    state = torch.tpu.get_rng_state()
    e = torch.rand(10, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(e, torch.rand(10, device="tpu").cpu())


def _draws(gen=None):
    kw = {} if gen is None else {"generator": gen}
    x = torch.empty(50, device="tpu")
    return [t.cpu() for t in (torch.randn(100, device="tpu", **kw), torch.rand(7, 3, device="tpu", **kw),
                              torch.randint(0, 9, (20,), device="tpu", **kw),
                              torch.randperm(30, device="tpu", **kw), x.normal_(**kw),
                              x.uniform_(**kw), x.bernoulli_(0.3, **kw),
                              torch.multinomial(torch.ones(10, device="tpu"), 4, **kw))]


def test_strict_and_defer_draw_the_same_values():
    """The same seed gives the same random values in both modes."""
    got = {}
    for mode in ("strict", "defer"):
        with lazyrt.set_mode(mode):
            torch.manual_seed(7)
            got[mode] = _draws() + [F.dropout(torch.ones(64, device="tpu"), 0.5).cpu()]
            got[mode] += _draws(torch.Generator(device="tpu").manual_seed(3))
    for a, b in zip(got["strict"], got["defer"]):
        assert torch.equal(a, b)


def test_tpu_generator(mode):
    """``torch.Generator(device="tpu")``: a stream of its own, reproducible by seed and by
    state, independent of the default one; a CPU generator on a tpu op is PyTorch's error."""
    g = torch.Generator(device="tpu")
    assert isinstance(g, torch.Generator) and g.device == torch.device("tpu", 0)
    assert isinstance(torch.default_generator, torch.Generator)
    assert torch.Generator().device.type == "cpu"
    g.manual_seed(11)
    torch.manual_seed(0)
    a = _draws(g)
    torch.manual_seed(1)  # the default stream does not matter
    g.manual_seed(11)
    b = _draws(g)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    state = g.get_state()
    c = _draws(g)
    assert not torch.equal(c[0], a[0])
    g.set_state(state)
    assert all(torch.equal(x, y) for x, y in zip(c, _draws(g)))
    assert g.initial_seed() == 11
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        torch.randn(3, device="tpu", generator=torch.Generator())


def test_random_distributions(mode):
    torch.manual_seed(0)
    n = 200_000
    x = torch.randn(n, device="tpu").cpu()
    assert abs(x.mean()) < 0.02 and abs(x.std() - 1) < 0.02
    u = torch.rand(n, device="tpu").cpu()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    r = torch.randint(3, 9, (n,), device="tpu").cpu()
    assert r.dtype == torch.int64 and r.min() == 3 and r.max() == 8
    y = torch.empty(n, device="tpu").normal_(2.0, 3.0).cpu()
    assert abs(y.mean() - 2) < 0.05 and abs(y.std() - 3) < 0.05
    z = torch.empty(n, device="tpu").uniform_(-2, 4).cpu()
    assert z.min() >= -2 and z.max() < 4 and abs(z.mean() - 1) < 0.05
    b = torch.bernoulli(torch.full((n,), 0.3, device="tpu")).cpu()
    assert abs(b.mean() - 0.3) < 0.01
    d = F.dropout(torch.ones(n, device="tpu"), 0.25).cpu()
    assert abs((d == 0).float().mean() - 0.25) < 0.01
    assert torch.allclose(d[d != 0], torch.tensor(1 / 0.75))
    p = torch.randperm(1000, device="tpu").cpu()
    assert torch.equal(p.sort().values, torch.arange(1000))
    w = torch.tensor([0.1, 0.2, 0.7], device="tpu")
    m = torch.multinomial(w, 30000, replacement=True).cpu()
    freq = torch.bincount(m, minlength=3).float() / 30000
    assert torch.allclose(freq, torch.tensor([0.1, 0.2, 0.7]), atol=0.02)
    m2 = torch.multinomial(torch.ones(4, 10, device="tpu"), 10).cpu()
    assert all(sorted(row) == list(range(10)) for row in m2.tolist())


# ---- errors ----------------------------------------------------------------------------------


def test_shape_error_raises_at_the_op(mode):
    a = torch.randn(2, 3, device="tpu")
    b = torch.randn(4, 5, device="tpu")
    # PyTorch's meta kernels word some messages differently from its CPU kernels.
    with pytest.raises(RuntimeError, match="size of tensor a|broadcast"):
        a + torch.randn(4, device="tpu")
    with pytest.raises(RuntimeError, match="cannot be multiplied|same reduction dim"):
        a @ b
    with pytest.raises(RuntimeError):
        a.view(5)
    with pytest.raises(IndexError):
        a.sum(dim=3)
    # the runtime stays usable
    assert_close(a + 1, a.cpu() + 1)


def test_dtype_error_and_device_mismatch(mode):
    a = torch.ones(3, dtype=torch.int64, device="tpu")
    with pytest.raises(RuntimeError, match="result type Float can't be cast|Promotion of int"):
        a.add_(1.5)
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(3, device="tpu") + torch.ones(3)


_LIB = torch.library.Library("lazyrt_test", "DEF")
_LIB.define("mystery(Tensor x) -> Tensor")
_LIB.impl("mystery", lambda x: x * 3 + 1, "CPU")


def test_unsupported_op_names_itself():
    x = torch.randn(4, device="tpu")
    with pytest.raises(NotImplementedError, match="'lazyrt_test.mystery.default' has no lowering"):
        torch.ops.lazyrt_test.mystery(x)
    lazyrt.set_cpu_fallback(True)
    try:
        lazyrt.metrics.reset()
        with pytest.warns(UserWarning, match="on the CPU"):
            y = torch.ops.lazyrt_test.mystery(x)
        assert y.device.type == "tpu"
        assert_close(y, x.cpu() * 3 + 1)
        c = lazyrt.metrics.counters()
        assert c["cpu_fallbacks"] == 1 and c["cpu_fallback_ops"] == {"lazyrt_test.mystery.default": 1}
    finally:
        lazyrt.set_cpu_fallback(False)


@torch.library.custom_op("lazyrt_test::scaled_scatter", mutates_args=())
def _scaled_scatter(shape: list[int], index: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(shape, dtype=vals.dtype, device=vals.device)
    return out.index_put((index,), vals * 2, accumulate=True)


@torch.library.custom_op("lazyrt_test::cuda_only", mutates_args=(), device_types="cuda")
def _cuda_only(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def test_custom_op_kernel_runs_on_tpu(mode):
    """A ``torch.library.custom_op`` with a kernel for every device runs that Python on tpu
    tensors (FlexAttention's ``flex_lib.zeros_and_scatter``); one with device kernels only
    for other devices names itself."""
    index, vals = torch.tensor([0, 2, 0]), torch.randn(3)
    got = torch.ops.lazyrt_test.scaled_scatter([4], index.to("tpu"), vals.to("tpu"))
    assert_close(got, torch.ops.lazyrt_test.scaled_scatter([4], index, vals))
    with pytest.raises(NotImplementedError, match="'lazyrt_test.cuda_only.default' has no lowering"):
        torch.ops.lazyrt_test.cuda_only(vals.to("tpu"))


def test_numpy_requires_cpu():
    x = torch.ones(2, device="tpu")
    with pytest.raises(TypeError, match="Use Tensor.cpu"):
        x.numpy()
    assert x.cpu().numpy().tolist() == [1.0, 1.0]


# ---- data-dependent ops ----------------------------------------------------------------------


def test_data_dependent_ops(mode):
    def f(x):
        nz = torch.nonzero(x > 0)
        sel = x[x > 0]
        ms = torch.masked_select(x, x < 0)
        u, inv, cnt = torch.unique(torch.round(x), return_inverse=True, return_counts=True)
        flag = bool((x > 10).any())
        if x.sum() > -100:
            flag = flag or True
        return nz, sel, ms, u, inv, cnt, torch.tensor(flag)

    _both(f, torch.randn(5, 4))


# ---- device API, modes, printing ------------------------------------------------------------


def test_dataloader_pin_memory_feeds_tpu(mode):
    """``DataLoader(pin_memory=True)``, as CUDA pipelines write it, pins for the current
    accelerator (tpu): batches come as CPU copies and move to tpu."""
    from torch.utils.data import DataLoader, TensorDataset

    data = torch.randn(8, 3)
    got = [xb.to("tpu", non_blocking=True) for xb, _ in
           DataLoader(TensorDataset(data, torch.arange(8)), batch_size=4, pin_memory=True)]
    assert_close(torch.cat(got).cpu(), data)
    x = torch.randn(5)
    p = x.pin_memory()
    assert p.device.type == "cpu" and p.data_ptr() != x.data_ptr() and torch.equal(p, x)


def test_grad_scaler_matches_cpu(mode):
    """``torch.amp.GradScaler("tpu")`` with float16 autocast, as CUDA scripts use it:
    unscale, skip the step on
    an inf, back off, grow after ``growth_interval`` clean steps; same scales and
    parameters as on the CPU."""
    import copy

    torch.manual_seed(0)
    models = {"cpu": torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                         torch.nn.Linear(8, 2))}
    models["tpu"] = copy.deepcopy(models["cpu"]).to("tpu")
    got = {}
    for dev, m in models.items():
        scaler = torch.amp.GradScaler(dev, init_scale=2.0 ** 16, growth_interval=2)
        opt = torch.optim.SGD(m.parameters(), 0.1)
        scales = []
        for step in range(6):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(step)).to(dev)
            if step == 3:
                x[0, 0] = float("inf")
            opt.zero_grad()
            with torch.autocast(dev, dtype=torch.float16):
                out = m(x)
            assert out.dtype == torch.float16
            scaler.scale(out.float().sum()).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        got[dev] = scales, [p.detach() for p in m.parameters()]
    scales = got["cpu"][0]
    assert got["tpu"][0] == scales
    assert_close(got["tpu"][1], got["cpu"][1], rtol=1e-2, atol=1e-3)  # float16 matmuls
    assert any(b < a for a, b in zip(scales, scales[1:]))  # a back-off
    assert any(b > a for a, b in zip(scales, scales[1:]))  # a growth


@pytest.mark.sweep(every=2)  # one mode by default (~20 s); -m slow: the other
def test_packed_sequences_through_rnns(mode):
    """``pack_padded_sequence`` (sorted or not) through an LSTM and a GRU, and back with
    ``pad_packed_sequence``: outputs, final states and every gradient as on the CPU."""
    import copy

    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    torch.manual_seed(0)
    nets = [torch.nn.LSTM(4, 5, batch_first=True, num_layers=2),
            torch.nn.GRU(4, 5, batch_first=True, bidirectional=True)]
    x = torch.randn(3, 6, 4)
    cases = ((torch.tensor([6, 4, 2]), True), (torch.tensor([2, 6, 5]), False))
    for net, (lengths, enforce) in zip(nets, cases):
        got = []
        for dev in ("cpu", "tpu"):
            m = copy.deepcopy(net).to(dev)
            xi = x.to(dev).clone().requires_grad_(True)
            packed = pack_padded_sequence(xi, lengths, batch_first=True, enforce_sorted=enforce)
            assert packed.batch_sizes.device.type == "cpu"
            out, h = m(packed)
            out, out_len = pad_packed_sequence(out, batch_first=True)
            h = h[0] if isinstance(h, tuple) else h
            (out.sum() + h.pow(2).sum()).backward()
            got.append([out, h, out_len, xi.grad] + [p.grad for p in m.parameters()])
        for a, b in zip(got[1], got[0]):
            assert_close(a, b)
    with pytest.raises(RuntimeError, match="must be sorted in decreasing order"):
        pack_padded_sequence(x.to("tpu"), torch.tensor([2, 6, 5]), batch_first=True)


def test_device_module_api():
    assert torch.tpu.is_available() and torch.tpu.device_count() == 1
    assert torch.tpu.current_device() == 0
    torch.tpu.set_device(0)
    assert "XLA" in torch.tpu.get_device_name() and "JAX" in torch.tpu.get_device_name()
    assert torch.tpu.get_device_properties(0).platform
    torch.tpu.manual_seed(5)
    assert torch.tpu.initial_seed() == 5
    torch.tpu.synchronize()
    assert torch.device("tpu").type == "tpu"
    assert torch.zeros(2, device="tpu").device == torch.device("tpu", 0)


def test_torch_accelerator_api(mode):
    """Device-generic code's ``torch.accelerator`` calls work with tpu as the accelerator."""
    acc = torch.accelerator
    assert acc.current_accelerator() == torch.device("tpu") and acc.device_count() == 1
    # NOTE: earlier tests' tensors freed by a later collection would lower the count below
    # ``before`` in the middle of this test
    gc.collect()
    acc.reset_peak_memory_stats()
    before = acc.memory_allocated()
    x = torch.ones(1000, device="tpu") * 2
    acc.synchronize()
    assert acc.memory_allocated() >= before + 4000
    assert acc.max_memory_allocated() >= acc.memory_allocated()
    assert acc.memory.memory_reserved() == acc.memory_allocated()
    assert acc.memory_stats()["allocated_bytes.all.current"] == acc.memory_allocated()
    del x
    acc.empty_cache()


def test_modes_api():
    assert lazyrt.get_mode() in ("strict", "debug", "defer")
    with lazyrt.set_mode("defer"):
        assert torch.tpu.eager_mode == torch.tpu.EagerMode.DEFER_AND_FUSE
        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
            assert lazyrt.get_mode() == "strict"
        assert lazyrt.get_mode() == "defer"
    with pytest.raises(ValueError, match="'strict', 'debug', 'defer'"):
        lazyrt.set_mode("fast")


@pytest.mark.parametrize("env,expected", [
    ({"TORCH_TPU_MODE": "defer"}, "defer"), ({"TORCH_TPU_MODE": "debug"}, "debug"),
    ({}, "strict"), ({"TORCH_TPU_DEFER_AND_FUSE": "1"}, "defer"),
    ({"TORCH_TPU_LAUNCH_BLOCKING": "1"}, "debug"),
])
@pytest.mark.subprocess
def test_mode_from_environment(env, expected):
    full = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", "import lazyrt; print(lazyrt.get_mode())"],
                         env=full, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == expected, out.stderr


@pytest.mark.subprocess
def test_bad_mode_env_is_a_clear_error():
    env = dict(os.environ, TORCH_TPU_MODE="fastest")
    out = subprocess.run([sys.executable, "-c", "import lazyrt"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0
    assert "TORCH_TPU_MODE='fastest' is not a valid mode" in out.stderr
    assert "'strict', 'debug', 'defer'" in out.stderr


def test_print_and_tolist(mode):
    x = torch.tensor([[1.5, 2.0], [3.0, 4.0]])
    t = x.to("tpu")
    assert repr(t) == repr(x)[:-1] + ", device='tpu:0')"
    assert repr(t.to(torch.int32)) == "tensor([[1, 2],\n        [3, 4]], device='tpu:0', dtype=torch.int32)"
    assert t.tolist() == x.tolist()
    assert t[0, 0].item() == 1.5
    r = torch.ones(2, device="tpu", requires_grad=True) * 2
    assert "grad_fn=<MulBackward0>" in repr(r)
    assert f"{t.sum():.1f}" == "10.5"


def test_matmul_precision_setting():
    a = torch.randn(64, 64)
    b = torch.randn(64, 64)
    exact = (a.double() @ b.double()).float()
    prev = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        hi = (a.to("tpu") @ b.to("tpu")).cpu()
        torch.testing.assert_close(hi, exact, rtol=1e-5, atol=1e-4)
        torch.set_float32_matmul_precision("medium")
        med = (a.to("tpu") @ b.to("tpu")).cpu()
        torch.testing.assert_close(med, exact, rtol=2e-2, atol=0.5)
    finally:
        torch.set_float32_matmul_precision(prev)


# ---- debug mode ---------------------------------------------------------------------------------


def test_debug_mode_names_op_that_made_nan():
    with lazyrt.set_mode("debug"):
        x = torch.tensor([1.0, -1.0], device="tpu")
        y = x * 2  # fine
        with pytest.raises(FloatingPointError, match=r"aten\.(sqrt|log)\.default produced NaN.*test_semantics\.py"):
            torch.sqrt(y)
        m = torch.zeros(3, device="tpu").masked_fill(torch.tensor([True, False, False], device="tpu"),
                                                       float("-inf"))
        assert m[0].item() == float("-inf")


def test_debug_compare_reports_divergence():
    from lazyrt._exec import debug as _debug
    from lazyrt._ops import resolve as _resolve
    from lazyrt.lowering._registry import LOWERINGS

    op = torch.ops.aten.sinh.default
    entry = _resolve.resolve(op)
    real = entry.fn
    prev = lazyrt.config.debug_compare
    try:
        entry.fn = lambda x: real(x) + 1.0  # a wrong lowering
        entry.plans.clear()
        lazyrt.config.debug_compare = True
        _debug.clear_divergences()
        with lazyrt.set_mode("debug"), pytest.warns(UserWarning, match="aten.sinh.default diverges"):
            torch.sinh(torch.ones(3, device="tpu"))
        assert _debug.divergences()
    finally:
        entry.fn = real
        entry.plans.clear()
        lazyrt.config.debug_compare = prev
        _debug.clear_divergences()
    assert LOWERINGS[op].fn is real


def test_coverage_report():
    c = lazyrt.coverage()
    assert c["counts"]["lowered"] >= 450
    assert "aten.mm.default" in c["lowered"]
    assert lazyrt.coverage("aten.add_.Tensor").status == "derived"
    assert lazyrt.coverage("aten.addmm.default").status == "lowered"
    assert lazyrt.coverage(torch.ops.lazyrt_test.mystery.default).status == "missing"


def test_autocast_bf16(mode):
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 4)
    x = torch.randn(5, 8)
    mt = torch.nn.Linear(8, 4).to("tpu")
    mt.load_state_dict(m.state_dict())
    with torch.autocast(device_type="tpu", dtype=torch.bfloat16):
        y = mt(x.to("tpu"))
        p = torch.softmax(y, -1)
        s = y + 1
    assert y.dtype == torch.bfloat16 and s.dtype == torch.bfloat16
    assert p.dtype == torch.float32  # CUDA's policy: softmax runs in fp32
    ref = (x.bfloat16() @ m.weight.bfloat16().t() + m.bias.bfloat16()).float()
    torch.testing.assert_close(y.float().cpu(), ref, rtol=2e-2, atol=2e-2)
    y.float().sum().backward()
    assert mt.weight.grad.dtype == torch.float32


def test_save_and_load_state_dict(tmp_path):
    m = torch.nn.Linear(3, 2).to("tpu")
    path = tmp_path / "m.pt"
    torch.save(m.state_dict(), path)
    sd = torch.load(path)  # weights_only=True, PyTorch's default
    assert sd["weight"].device.type == "tpu"
    assert torch.equal(sd["weight"].cpu(), m.weight.detach().cpu())
    cpu = torch.load(path, map_location="cpu")
    assert cpu["bias"].device.type == "cpu"
    import copy

    m2 = copy.deepcopy(m)
    assert isinstance(m2.weight, torch.nn.Parameter) and m2.weight.device.type == "tpu"
    assert torch.equal(m2.weight.detach().cpu(), m.weight.detach().cpu())


def test_load_checkpoint_with_map_location_tpu(tmp_path):
    """``torch.load(ckpt, map_location="tpu")``, as CUDA scripts load checkpoints: a CPU
    checkpoint of a model, its optimizer and plain values comes back on tpu and resumes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 3,
                "shared": [model[0].weight] * 2}, path)
    for loc in ("tpu", torch.device("tpu", 0)):
        ck = torch.load(path, map_location=loc)
        assert ck["epoch"] == 3 and type(ck["model"]) is type(model.state_dict())
        assert all(v.device.type == "tpu" for v in ck["model"].values())
        assert ck["shared"][0] is ck["shared"][1] and isinstance(ck["shared"][0], torch.nn.Parameter)
        resumed = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).to("tpu")
        resumed.load_state_dict(ck["model"])
        opt2 = torch.optim.AdamW(resumed.parameters())
        opt2.load_state_dict(ck["opt"])
        assert opt2.state[resumed[0].weight]["exp_avg"].device.type == "tpu"
        for k, v in model.state_dict().items():
            assert_close(resumed.state_dict()[k], v)
