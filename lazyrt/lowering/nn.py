"""Neural-network ops: normalization, convolution, pooling, losses and their
backward ops."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._registry import aten, lower, named
from ._util import matmul_precision, opmath, vjp

# ---- normalization -----------------------------------------------------------------


@lower(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    x = opmath(input)
    k = len(normalized_shape)
    ax = tuple(range(x.ndim - k, x.ndim))
    mean = jnp.mean(x, axis=ax, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=ax, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd


@lower(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                               output_mask):
    x = opmath(input)
    g = opmath(grad_out)
    k = len(normalized_shape)
    ax = tuple(range(x.ndim - k, x.ndim))
    bax = tuple(range(x.ndim - k))
    n = 1
    for s in normalized_shape:
        n *= s
    xhat = (x - mean) * rstd
    gw = g * weight if weight is not None else g
    dx = None
    if output_mask[0]:
        dx = rstd / n * (n * gw - jnp.sum(gw, axis=ax, keepdims=True)
                         - xhat * jnp.sum(gw * xhat, axis=ax, keepdims=True))
    dw = jnp.sum(g * xhat, axis=bax) if output_mask[1] and weight is not None else None
    db = jnp.sum(g, axis=bax) if output_mask[2] and bias is not None else None
    return dx, dw, db


def _bn_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _bshape(x, v):
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    x = opmath(input)
    ax = _bn_axes(x)
    if training:
        mean = jnp.mean(x, axis=ax)
        var = jnp.mean(jnp.square(x - _bshape(x, mean)), axis=ax)
        n = x.size // x.shape[1]
        new_rm = new_rv = None
        if running_mean is not None:
            new_rm = (1 - momentum) * running_mean + momentum * mean
        if running_var is not None:
            unbiased = var * (n / max(n - 1, 1))
            new_rv = (1 - momentum) * running_var + momentum * unbiased
        rstd = lax.rsqrt(var + eps)
        save_mean, save_rstd = mean, rstd
    else:
        mean, var = running_mean, running_var
        rstd = lax.rsqrt(var + eps)
        new_rm, new_rv = running_mean, running_var
        # PyTorch's meta kernels give the eval-mode saved stats shape [C] (its CPU kernel
        # returns empty tensors): return the statistics used.
        save_mean, save_rstd = mean, rstd
    out = (x - _bshape(x, mean)) * _bshape(x, rstd)
    if weight is not None:
        out = out * _bshape(x, weight)
    if bias is not None:
        out = out + _bshape(x, bias)
    return out, save_mean, save_rstd, new_rm, new_rv


@lower(aten.native_batch_norm.default, mutates=("running_mean", "running_var"))
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, sm, sr, rm, rv = _batch_norm(input, weight, bias, running_mean, running_var, training,
                                      momentum, eps)
    muts = tuple(v for v, r in ((rm, running_mean), (rv, running_var)) if r is not None)
    return (out, sm, sr) + muts


@lower(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    out, sm, sr, rm, rv = _batch_norm(input, weight, bias, running_mean, running_var, training,
                                      momentum, eps)
    return out, sm, sr, rm, rv


@lower(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    out, sm, sr, _, _ = _batch_norm(input, weight, bias, None, None, True, momentum, eps)
    return out, sm, sr


@lower(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    out, sm, sr, _, _ = _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)
    return out, sm, sr


@lower(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                               save_invstd, train, eps, output_mask):
    x = opmath(input)
    g = opmath(grad_out)
    ax = _bn_axes(x)
    if train:
        mean, rstd = save_mean, save_invstd
    else:
        mean, rstd = running_mean, lax.rsqrt(running_var + eps)
    n = x.size // x.shape[1]
    xhat = (x - _bshape(x, mean)) * _bshape(x, rstd)
    w = weight if weight is not None else jnp.ones((x.shape[1],), x.dtype)
    dx = None
    if output_mask[0]:
        if train:
            gs = jnp.sum(g, axis=ax)
            gxs = jnp.sum(g * xhat, axis=ax)
            dx = _bshape(x, w * rstd) / n * (n * g - _bshape(x, gs) - xhat * _bshape(x, gxs))
        else:
            dx = g * _bshape(x, w * rstd)
    dw = jnp.sum(g * xhat, axis=ax) if output_mask[1] else None
    db = jnp.sum(g, axis=ax) if output_mask[2] else None
    return dx, dw, db


@lower(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    x = opmath(input)
    xr = x.reshape(N, group, (C // group) * HxW)
    mean = jnp.mean(xr, axis=-1)
    var = jnp.mean(jnp.square(xr - mean[..., None]), axis=-1)
    rstd = lax.rsqrt(var + eps)
    out = ((xr - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    if weight is not None:
        out = out * _bshape(x, weight)
    if bias is not None:
        out = out + _bshape(x, bias)
    return out, mean, rstd


@lower(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    x = opmath(input)
    g = opmath(grad_out)
    xr = x.reshape(N, group, (C // group) * HxW)
    xhat = ((xr - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    w = weight if weight is not None else jnp.ones((C,), x.dtype)
    gw = (g * _bshape(x, w)).reshape(N, group, (C // group) * HxW)
    xh = xhat.reshape(N, group, (C // group) * HxW)
    m = gw.shape[-1]
    dx = None
    if output_mask[0]:
        dx = (rstd[..., None] / m * (m * gw - jnp.sum(gw, -1, keepdims=True)
                                     - xh * jnp.sum(gw * xh, -1, keepdims=True))).reshape(x.shape)
    red = (0,) + tuple(range(2, x.ndim))
    dw = jnp.sum(g * xhat, axis=red) if output_mask[1] else None
    db = jnp.sum(g, axis=red) if output_mask[2] else None
    return dx, dw, db


# ---- convolution ----------------------------------------------------------------------------


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups, widen=True):
    """``widen``: bfloat16/float16 inputs give a float32 output (``preferred_element_type``);
    False: an output in the inputs' dtype (XLA still accumulates in float32)."""
    nd = x.ndim - 2
    # ATen takes a one-element list for every spatial dim (``padding="valid"`` gives [0]).
    stride, padding, dilation, output_padding = (
        tuple(v) * nd if len(v) == 1 else tuple(v)
        for v in (stride, padding, dilation, output_padding))
    dn = lax.conv_dimension_numbers(x.shape, w.shape, ("NC" + "DHW"[3 - nd:], "OI" + "DHW"[3 - nd:],
                                                       "NC" + "DHW"[3 - nd:]))
    prec = matmul_precision()
    pref = jnp.float32 if widen and x.dtype in (jnp.bfloat16, jnp.float16) else None
    if not transposed:
        return lax.conv_general_dilated(x, w, tuple(stride), [(p, p) for p in padding],
                                        rhs_dilation=tuple(dilation), dimension_numbers=dn,
                                        feature_group_count=groups, precision=prec,
                                        preferred_element_type=pref)
    # Transposed conv = gradient of conv w.r.t. its input: dilate the input by the stride.
    # weight: [Cin, Cout/groups, k...] -> [Cout, Cin/groups, k...], flipped.
    cin = w.shape[0]
    cout_g = w.shape[1]
    k = w.shape[2:]
    wg = w.reshape((groups, cin // groups, cout_g) + k)
    wg = jnp.swapaxes(wg, 1, 2).reshape((groups * cout_g, cin // groups) + k)
    wg = jnp.flip(wg, axis=tuple(range(2, 2 + nd)))
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op)
            for kk, p, d, op in zip(k, padding, dilation, output_padding)]
    return lax.conv_general_dilated(x, wg, (1,) * nd, pads, lhs_dilation=tuple(stride),
                                    rhs_dilation=tuple(dilation), dimension_numbers=dn,
                                    feature_group_count=groups, precision=prec,
                                    preferred_element_type=pref)


@lower(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * (out.ndim - 2))
    return out


# NOTE: what a TorchScript trace records for a convolution, as on the CPU (``_torch.patches.
# _jit_trace_untraced_dispatch``); the flags choose among CUDA/cuDNN kernels.
@lower(aten._convolution.default)
def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups, benchmark, deterministic, cudnn_enabled, allow_tf32):
    return convolution(input, weight, bias, stride, padding, dilation, transposed,
                       output_padding, groups)


@lower(aten.convolution_backward.default)
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    # NOTE: differentiated with an output in the inputs' dtype, so that in bfloat16/float16
    # the transposed convolutions take the cotangent as it is and run in that dtype (a
    # float32 output would make them float32 convolutions); XLA accumulates them in float32
    # on every platform, as the forward's preferred_element_type does (same values on CPU).
    def f(x, w):
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups,
                     widen=False)

    _, pull = vjp(f, input, weight)
    dx, dw = pull(grad_output)
    db = jnp.sum(grad_output, axis=(0,) + tuple(range(2, grad_output.ndim))) if output_mask[2] else None
    return (dx if output_mask[0] else None, dw if output_mask[1] else None, db)


# ---- pooling ------------------------------------------------------------------------------


def _pool_pads(x_shape, kernel, stride, padding, dilation, ceil_mode):
    pads = []
    for n, k, s, p, d in zip(x_shape, kernel, stride, padding, dilation):
        eff = d * (k - 1) + 1
        out = (n + 2 * p - eff) // s + 1
        if ceil_mode:
            out = -(-(n + 2 * p - eff) // s) + 1
            if (out - 1) * s >= n + p:
                out -= 1
        hi = (out - 1) * s + eff - n - p
        pads.append((p, max(hi, 0)))
    return pads


def _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, nd):
    kernel = tuple(kernel_size) * (nd if len(kernel_size) == 1 else 1)
    stride = tuple(stride) if stride else kernel
    stride = stride * (nd if len(stride) == 1 else 1)
    padding = tuple(padding) * (nd if len(padding) == 1 else 1)
    dilation = tuple(dilation) * (nd if len(dilation) == 1 else 1)
    spatial = x.shape[-nd:]
    pads = _pool_pads(spatial, kernel, stride, padding, dilation, ceil_mode)
    lead = x.ndim - nd
    neg = -jnp.inf if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.iinfo(x.dtype).min
    # Flat spatial index of each element, carried through the window reduction.
    idx = jnp.arange(math.prod(spatial)).reshape(spatial)
    idx = jnp.broadcast_to(idx, x.shape)
    win = (1,) * lead + kernel
    strides = (1,) * lead + stride
    dil = (1,) * lead + dilation
    padcfg = [(0, 0)] * lead + pads

    def reducer(a, b):
        va, ia = a
        vb, ib = b
        take_b = (vb > va) | jnp.isnan(vb) if jnp.issubdtype(va.dtype, jnp.inexact) else vb > va
        take_b = take_b | ((vb == va) & (ib < ia))
        if jnp.issubdtype(va.dtype, jnp.inexact):
            take_b = take_b & ~(jnp.isnan(va) & ~jnp.isnan(vb))
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    vals, inds = lax.reduce_window((x, idx.astype(jnp.int64)),
                                   (jnp.asarray(neg, x.dtype), jnp.asarray(-1, jnp.int64)),
                                   reducer, win, strides, padcfg, window_dilation=dil)
    return vals, inds


@lower(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 2)


@lower(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 3)


def _max_pool_backward(grad_output, self, indices, nd):
    spatial = self.shape[-nd:]
    lead = self.shape[:-nd]
    n = 1
    for s in spatial:
        n *= s
    g = grad_output.reshape(lead + (-1,))
    i = indices.reshape(lead + (-1,))
    out = jnp.zeros(lead + (n,), grad_output.dtype)
    lead_idx = jnp.meshgrid(*[jnp.arange(s) for s in lead] + [jnp.arange(g.shape[-1])], indexing="ij")
    out = out.at[tuple(lead_idx[:-1]) + (i,)].add(g)
    return out.reshape(self.shape)


@lower(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    return _max_pool_backward(grad_output, self, indices, 2)


@lower(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    return _max_pool_backward(grad_output, self, indices, 3)


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, nd):
    kernel = tuple(kernel_size) * (nd if len(kernel_size) == 1 else 1)
    stride = tuple(stride) if stride else kernel
    stride = stride * (nd if len(stride) == 1 else 1)
    padding = tuple(padding) * (nd if len(padding) == 1 else 1)
    spatial = x.shape[-nd:]
    pads = _pool_pads(spatial, kernel, stride, padding, (1,) * nd, ceil_mode)
    lead = x.ndim - nd
    xf = opmath(x)
    win = (1,) * lead + kernel
    strides = (1,) * lead + stride
    padcfg = [(0, 0)] * lead + pads
    s = lax.reduce_window(xf, np.array(0, xf.dtype), lax.add, win, strides, padcfg)
    if divisor_override:
        return s / divisor_override
    # Divisor: window size clipped to the (explicitly) padded input, per PyTorch.
    ones = jnp.ones(spatial, xf.dtype)
    if count_include_pad:
        ones = jnp.pad(ones, [(p, p) for p in padding], constant_values=1)
        extra = [(0, hi - p) for (lo, hi), p in zip(pads, padding)]
        cnt = lax.reduce_window(ones, np.array(0, xf.dtype), lax.add, kernel, stride,
                                [(0, max(e, 0)) for _, e in extra])
    else:
        cnt = lax.reduce_window(ones, np.array(0, xf.dtype), lax.add, kernel, stride, pads)
    return s / cnt


@lower(aten.avg_pool2d.default)
def avg_pool2d(self, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, 2)


@lower(aten.avg_pool3d.default)
def avg_pool3d(self, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, 3)


@lower(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):
    _, pull = vjp(lambda x: _avg_pool(x, kernel_size, stride, padding, ceil_mode,
                                      count_include_pad, divisor_override, 2), opmath(self))
    return pull(grad_output)[0]


@lower(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):
    _, pull = vjp(lambda x: _avg_pool(x, kernel_size, stride, padding, ceil_mode,
                                      count_include_pad, divisor_override, 3), opmath(self))
    return pull(grad_output)[0]


def _adaptive_avg(x, output_size):
    nd = len(output_size)
    out = opmath(x)
    for i, o in enumerate(output_size):
        ax = x.ndim - nd + i
        n = x.shape[ax]
        if n % o == 0:
            k = n // o
            shape = out.shape[:ax] + (o, k) + out.shape[ax + 1:]
            out = jnp.mean(out.reshape(shape), axis=ax + 1)
        else:
            pieces = []
            for j in range(o):
                s = (j * n) // o
                e = -(-((j + 1) * n) // o)
                pieces.append(jnp.mean(lax.slice_in_dim(out, s, e, axis=ax), axis=ax, keepdims=True))
            out = jnp.concatenate(pieces, axis=ax)
    return out


@lower(aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(self, output_size):
    return _adaptive_avg(self, tuple(output_size))


@lower(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(self, output_size):
    return _adaptive_avg(self, tuple(output_size))


@lower(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, self):
    _, pull = vjp(lambda x: _adaptive_avg(x, grad_output.shape[-2:]), opmath(self))
    return pull(grad_output)[0]


@lower(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad_output, self):
    _, pull = vjp(lambda x: _adaptive_avg(x, grad_output.shape[-3:]), opmath(self))
    return pull(grad_output)[0]


# ---- losses -------------------------------------------------------------------------------


def _nll(self, target, weight, reduction, ignore_index):
    x = opmath(self)
    if x.ndim == 1:
        x = x[None]
        target = target.reshape(1)
    c = x.shape[1]
    t = target.astype(jnp.int64)
    valid = t != ignore_index
    tc = jnp.where(valid, t, 0)
    picked = jnp.take_along_axis(x, jnp.expand_dims(tc, 1), axis=1).squeeze(1)
    w = jnp.ones((c,), x.dtype) if weight is None else weight.astype(x.dtype)
    wt = jnp.where(valid, w[tc], 0)
    loss = -picked * wt
    if reduction == 0:
        return loss if self.ndim > 1 else loss[0], jnp.zeros((), x.dtype)
    total = jnp.sum(wt)
    if reduction == 1:
        return jnp.sum(loss) / total, total
    return jnp.sum(loss), total


@lower(aten.nll_loss_forward.default)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    return _nll(self, target, weight, reduction, ignore_index)


@lower(aten.nll_loss2d_forward.default)
def nll_loss2d_forward(self, target, weight, reduction, ignore_index):
    return _nll(self, target, weight, reduction, ignore_index)


def _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    x = self
    squeeze = x.ndim == 1
    if squeeze:
        x = x[None]
        target = target.reshape(1)
    c = x.shape[1]
    t = target.astype(jnp.int64)
    valid = t != ignore_index
    tc = jnp.where(valid, t, 0)
    w = jnp.ones((c,), x.dtype) if weight is None else weight.astype(x.dtype)
    wt = jnp.where(valid, w[tc], 0)
    g = grad_output
    if reduction == 1:
        g = g / total_weight
    if reduction == 0 and not squeeze:
        gv = -g * wt
    else:
        gv = -jnp.broadcast_to(g, wt.shape) * wt
    onehot = jax.nn.one_hot(tc, c, axis=1, dtype=x.dtype)
    out = onehot * jnp.expand_dims(gv, 1)
    return out[0] if squeeze else out


@lower(aten.nll_loss_backward.default)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)


@lower(aten.nll_loss2d_backward.default)
def nll_loss2d_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)


def _reduce(x, reduction):
    if reduction == 1:
        return jnp.mean(x)
    if reduction == 2:
        return jnp.sum(x)
    return x


@lower(aten.mse_loss.default)
def mse_loss(self, target, reduction=1):
    return _reduce(jnp.square(opmath(self) - target), reduction)


@lower(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output, self, target, reduction):
    g = 2 * (self - target) * grad_output
    return g / self.size if reduction == 1 else g


@lower(aten.l1_loss.default)
def l1_loss(self, target, reduction=1):
    return _reduce(jnp.abs(self - target), reduction)


@lower(aten.smooth_l1_loss.default)
def smooth_l1_loss(self, target, reduction=1, beta=1.0):
    d = jnp.abs(opmath(self) - target)
    loss = jnp.where(d < beta, 0.5 * d * d / jnp.where(beta == 0, 1, beta), d - 0.5 * beta)
    return _reduce(loss, reduction)


@lower(aten.huber_loss.default)
def huber_loss(self, target, reduction=1, delta=1.0):
    d = jnp.abs(opmath(self) - target)
    loss = jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))
    return _reduce(loss, reduction)


@lower(aten.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=1):
    x = opmath(self)
    loss = -(target * jnp.maximum(jnp.log(x), -100) + (1 - target) * jnp.maximum(jnp.log1p(-x), -100))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@lower(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=1):
    x = opmath(self)
    g = grad_output * (x - target) / jnp.maximum((1 - x) * x, 1e-12)
    if weight is not None:
        g = g * weight
    return g / self.size if reduction == 1 else g


@lower(aten.binary_cross_entropy_with_logits.default)
def bce_with_logits(self, target, weight=None, pos_weight=None, reduction=1):
    x = opmath(self)
    log_sig = jax.nn.log_sigmoid(x)
    log_1m = jax.nn.log_sigmoid(-x)
    if pos_weight is not None:
        loss = -(pos_weight * target * log_sig + (1 - target) * log_1m)
    else:
        loss = -(target * log_sig + (1 - target) * log_1m)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


# ---- distances, bilinear, embedding_bag -------------------------------------------------------


def _pnorm_last(d, p):
    """p-norm over the last axis of |differences| d, for a runtime p (0, inf, or > 0)."""
    safe_p = jnp.where((p == 0) | jnp.isinf(p), 1.0, p).astype(d.dtype)
    general = jnp.sum(d ** safe_p, axis=-1) ** (1 / safe_p)
    zero = jnp.sum((d != 0).astype(d.dtype), axis=-1)
    inf = jnp.max(d, axis=-1, initial=0)
    return jnp.where(p == 0, zero, jnp.where(jnp.isinf(p), inf, general))


@lower(aten._cdist_forward.default)
def _cdist_forward(x1, x2, p, compute_mode):
    a = opmath(x1)
    b = opmath(x2)
    if a.shape[-1] == 0 or a.size == 0 or b.size == 0:
        batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        return jnp.zeros(batch + (a.shape[-2], b.shape[-2]), a.dtype)
    d = jnp.abs(a[..., :, None, :] - b[..., None, :, :])
    return _pnorm_last(d, p)


@lower(aten._pdist_forward.default)
def _pdist_forward(self, p=2.0):
    n = self.shape[0]
    i, j = np.triu_indices(n, 1)
    x = opmath(self)
    if i.size == 0:
        return jnp.zeros((0,), x.dtype)
    d = jnp.abs(x[i] - x[j])
    if x.shape[1] == 0:
        return jnp.zeros((i.size,), x.dtype)
    return _pnorm_last(d, p)


def _dist_backward_term(diff, grad, dist, p):
    """PyTorch's per-coordinate distance backward (Distance.cpp): its conventions at zero
    distances and at ties of the inf-norm differ from the vjp of the forward."""
    ad = jnp.abs(diff)
    sg = jnp.sign(diff)
    dz = dist == 0
    safe_dist = jnp.where(dz, 1, dist)
    pp = jnp.where(jnp.isinf(p) | (p == 0), 2.0, p).astype(diff.dtype)
    lt2 = jnp.where(dz | ((diff == 0) & (pp < 1)), 0,
                    sg * jnp.where(ad == 0, 0, ad ** (pp - 1)) * grad / safe_dist ** (pp - 1))
    two = jnp.where(dz, 0, grad * diff / safe_dist)
    gen = jnp.where(dz, 0, diff * ad ** (pp - 2) * grad / safe_dist ** (pp - 1))
    out = jnp.where(pp < 2, lt2, jnp.where(pp == 2, two, gen))
    out = jnp.where(p == 1, grad * sg, out)
    out = jnp.where(jnp.isinf(p), grad * sg * (ad == dist), out)
    return jnp.where(p == 0, 0, out)


@lower(aten._cdist_backward.default, static_floats=True)
def _cdist_backward(grad, x1, x2, p, cdist):
    # static p: ATen returns zeros shaped like x1 (not the broadcast batch) for p = 0
    if p == 0 or grad.size == 0 or x1.size == 0 or x2.size == 0:
        return jnp.zeros_like(x1)
    a, b = opmath(x1), opmath(x2)
    diff = a[..., :, None, :] - b[..., None, :, :]  # ..., P, R, M
    t = _dist_backward_term(diff, grad[..., None].astype(a.dtype), cdist[..., None].astype(a.dtype), p)
    # over the broadcast batch, like ATen: autograd sums it down to x1's shape
    return jnp.sum(t, axis=-2).astype(x1.dtype)


@lower(aten._pdist_backward.default)
def _pdist_backward(grad, self, p, pdist):
    n = self.shape[0]
    i, j = np.triu_indices(n, 1)
    x = opmath(self)
    if i.size == 0:
        return jnp.zeros_like(self)
    t = _dist_backward_term(x[i] - x[j], grad[:, None].astype(x.dtype), pdist[:, None].astype(x.dtype), p)
    out = jnp.zeros_like(x).at[jnp.asarray(i)].add(t).at[jnp.asarray(j)].add(-t)
    return out.astype(self.dtype)


@lower(aten._trilinear.default)
def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    def ex(t, e):
        for d in sorted(e):
            t = jnp.expand_dims(t, d)
        return t

    out = ex(i1, expand1) * ex(i2, expand2) * ex(i3, expand3)
    if sumdim:
        out = jnp.sum(out, axis=tuple(sorted(set(sumdim))))
    return out


def _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
                   include_last_offset, padding_idx):
    idx = indices.reshape(-1).astype(jnp.int64)
    off = offsets.reshape(-1).astype(jnp.int64)
    n = idx.shape[0]
    nb = off.shape[0] - (1 if include_last_offset else 0)
    dim = weight.shape[1]
    pos = jnp.arange(n)
    seg = (jnp.searchsorted(off[:nb] if nb else off[:1], pos, side="right") - 1) if nb else \
        jnp.zeros((n,), jnp.int64)
    seg = jnp.clip(seg, 0, max(nb - 1, 0)).astype(jnp.int64)
    end = off[nb] if include_last_offset and nb >= 0 and off.shape[0] > nb else n
    keep = pos < end
    if padding_idx is not None and padding_idx >= 0:
        keep = keep & (idx != padding_idx)
    rows = jnp.take(weight, jnp.clip(idx, 0, weight.shape[0] - 1), axis=0)
    counts = jnp.zeros((max(nb, 0),), jnp.int64).at[seg].add(keep.astype(jnp.int64))
    if mode == 2:
        neg = jnp.asarray(-jnp.inf, rows.dtype)
        vals = jnp.where(keep[:, None], rows, neg)
        out = jnp.full((nb, dim), -jnp.inf, rows.dtype).at[seg].max(vals)
        out = jnp.where(counts[:, None] > 0, out, 0)
        # the embedding index of each max (first occurrence)
        hit = (vals == out[seg]) & keep[:, None]
        cand = jnp.where(hit, pos[:, None], n)
        first = jnp.full((nb, dim), n, jnp.int64).at[seg].min(cand)
        max_idx = jnp.where(first < n, idx[jnp.clip(first, 0, max(n - 1, 0))], 0)
    else:
        rows = opmath(rows)  # ATen (fbgemm) sums low-precision bags in float32
        if per_sample_weights is not None:
            rows = rows * opmath(per_sample_weights).reshape(-1, 1).astype(rows.dtype)
        out = jnp.zeros((nb, dim), rows.dtype).at[seg].add(jnp.where(keep[:, None], rows, 0))
        if mode == 1:
            out = out / jnp.maximum(counts, 1)[:, None].astype(out.dtype)
        max_idx = jnp.zeros((0,), jnp.int64)
    bag_size = jnp.zeros(off.shape, jnp.int64).at[:nb].set(counts) if nb != off.shape[0] \
        else counts
    return out, seg, bag_size, max_idx


@lower(aten._embedding_bag_forward_only.default, aten._embedding_bag.default)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    return _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse,
                          per_sample_weights, include_last_offset, padding_idx)


# ---- grid sampling -------------------------------------------------------------------------


def _grid_unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord, lo2, hi2):
    """Reflect coordinates into [lo2/2, hi2/2] (PyTorch's reflect_coordinates, twice-scaled bounds)."""
    if lo2 == hi2:
        return jnp.zeros_like(coord)
    mn = lo2 / 2
    span = (hi2 - lo2) / 2
    c = jnp.abs(coord - mn)
    extra = jnp.fmod(c, span)
    flips = jnp.floor(c / span)
    return jnp.where(flips % 2 == 0, extra + mn, span - extra + mn)


def _grid_source_index(coord, size, padding_mode, align_corners):
    return _grid_pad(_grid_unnormalize(coord, size, align_corners), size, padding_mode,
                     align_corners)


def _grid_pad(c, size, padding_mode, align_corners):
    if padding_mode == 1:  # border
        c = jnp.clip(c, 0, size - 1)
    elif padding_mode == 2:  # reflection
        c = _reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1)
        c = jnp.clip(c, 0, size - 1)
    return c


def _grid_sample_nd(input, grid, interpolation_mode, padding_mode, align_corners):
    """2-D/3-D grid_sample with bilinear (0), nearest (1) or (2-D) bicubic (2) interpolation.
    All compute in the input's dtype, as ATen's CPU kernels do (for bfloat16 a float32
    computation differs from CPU's by several bfloat16 ulps)."""
    x = input
    nd = x.ndim - 2
    N, C = x.shape[:2]
    sizes = x.shape[2:]  # (D,) H, W
    g = grid.astype(x.dtype)
    out_sp = g.shape[1:-1]
    # grid's last dim is (x, y[, z]) = (W, H[, D])
    coords = [_grid_source_index(g[..., nd - 1 - d], sizes[d], padding_mode, align_corners)
              for d in range(nd)]
    xf = x.reshape(N, C, -1)
    strides = [int(np.prod(sizes[d + 1:])) for d in range(nd)]

    def gather(idx_list):
        valid = jnp.ones(idx_list[0].shape, jnp.bool_)
        flat = jnp.zeros(idx_list[0].shape, jnp.int64)
        for d, i in enumerate(idx_list):
            valid = valid & (i >= 0) & (i < sizes[d])
            flat = flat + jnp.clip(i, 0, sizes[d] - 1).astype(jnp.int64) * strides[d]
        v = jnp.take_along_axis(xf, flat.reshape(N, 1, -1), axis=2)  # N, C, P
        v = v.reshape((N, C) + out_sp)
        return jnp.where(valid[:, None], v, 0)

    if interpolation_mode == 1:  # nearest (round half to even, like nearbyint)
        return gather([jnp.round(c) for c in coords])
    if interpolation_mode == 2 and nd == 2:
        return _grid_bicubic(x, g, gather, sizes, padding_mode, align_corners)
    if interpolation_mode != 0:
        raise NotImplementedError("lazyrt: grid_sampler: bicubic is only supported in 2-D")
    lo = [jnp.floor(c) for c in coords]
    fr = [c - f for c, f in zip(coords, lo)]
    out = 0
    for corner in range(2 ** nd):
        bits = [(corner >> (nd - 1 - d)) & 1 for d in range(nd)]
        w = 1
        for d, b in enumerate(bits):
            w = w * (fr[d] if b else 1 - fr[d])
        out = out + gather([lo[d] + bits[d] for d in range(nd)]) * w[:, None]
    return out


def _cubic_weights(t):
    A = -0.75

    def cc1(v):
        return ((A + 2) * v - (A + 3)) * v * v + 1

    def cc2(v):
        return ((A * v - 5 * A) * v + 8 * A) * v - 4 * A

    return cc2(t + 1.0), cc1(t), cc1(1.0 - t), cc2(2.0 - t)


def _grid_bicubic(x, g, gather, sizes, padding_mode, align_corners):
    """PyTorch's bicubic grid sampling (A = -0.75): 4x4 taps around the unnormalized
    coordinate, each tap padded (border/reflection) and zero outside."""
    H, W = sizes
    ix = _grid_unnormalize(g[..., 0], W, align_corners)
    iy = _grid_unnormalize(g[..., 1], H, align_corners)
    ix0, iy0 = jnp.floor(ix), jnp.floor(iy)
    wx = _cubic_weights(ix - ix0)
    wy = _cubic_weights(iy - iy0)

    def tap(px, py):
        return gather([_grid_pad(py, H, padding_mode, align_corners),
                       _grid_pad(px, W, padding_mode, align_corners)])

    out = 0
    for j in range(4):
        row = 0
        for i in range(4):
            row = row + tap(ix0 + (i - 1), iy0 + (j - 1)) * wx[i][:, None]
        out = out + row * wy[j][:, None]
    return out


@lower(aten.grid_sampler_2d.default)
def grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample_nd(input, grid, interpolation_mode, padding_mode, align_corners)


@lower(aten.grid_sampler_3d.default)
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample_nd(input, grid, interpolation_mode, padding_mode, align_corners)


# ---- nearest upsampling backward, embedding_bag backward -------------------------------------


def _nearest_src(out_size, in_size, scale, exact):
    """Source index of every output position, computed like ATen (float32 math)."""
    s = np.float32(1.0 / scale) if scale is not None and scale > 0 else \
        np.float32(in_size) / np.float32(out_size)
    pos = np.arange(out_size, dtype=np.float32)
    if exact:
        pos = pos + np.float32(0.5)
    return np.minimum(np.floor(pos * s).astype(np.int64), in_size - 1)


def _upsample_nearest_backward(grad_output, output_size, input_size, scales, exact):
    nd = len(output_size)
    g = grad_output
    lead = g.ndim - nd
    for d in range(nd):
        src = _nearest_src(output_size[d], input_size[lead + d], scales[d], exact)
        ax = lead + d
        moved = jnp.moveaxis(g, ax, 0)
        summed = jax.ops.segment_sum(moved, jnp.asarray(src), num_segments=input_size[ax],
                                     indices_are_sorted=True)
        g = jnp.moveaxis(summed, 0, ax)
    return g


def _register_upsample_nearest_backward(nd):
    for name, exact in ((f"upsample_nearest{nd}d_backward", False),
                        (f"_upsample_nearest_exact{nd}d_backward", True)):
        op = getattr(aten, name).default

        def fn(grad_output, output_size, input_size, *scales, _exact=exact, _nd=nd, **kw):
            sc = list(scales) + [kw.get(k) for k in ("scales", "scales_d", "scales_h", "scales_w")
                                 if k in kw]
            sc = (sc + [None] * _nd)[:_nd]
            return _upsample_nearest_backward(grad_output, output_size, input_size, sc, _exact)

        lower(op, static_floats=True)(named(fn, name))


for _nd in (1, 2, 3):
    _register_upsample_nearest_backward(_nd)


@lower(aten._embedding_bag_backward.default)
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                           num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights,
                           padding_idx=-1):
    return _embedding_bag_dense_grad(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                                     num_weights, scale_grad_by_freq, mode, per_sample_weights,
                                     padding_idx)


@lower(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                 scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):
    return _embedding_bag_dense_grad(grad, indices, None, offset2bag, bag_size, maximum_indices,
                                     num_weights, scale_grad_by_freq, mode, per_sample_weights,
                                     padding_idx)


def _embedding_bag_dense_grad(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
                              num_weights, scale_grad_by_freq, mode, per_sample_weights,
                              padding_idx):
    """Dense gradient of ``weight`` for the ``_embedding_bag`` lowering above (its
    ``offset2bag`` is the bag of every index, ``bag_size`` the per-bag count)."""
    idx = indices.reshape(-1).astype(jnp.int64)
    n = idx.shape[0]
    nb, dim = grad.shape
    out = jnp.zeros((num_weights, dim), grad.dtype)
    if mode == 2:  # max: each (bag, feature) routes its gradient to the argmax row
        mi = maximum_indices.astype(jnp.int64)
        valid = bag_size[:nb, None] > 0
        cols = jnp.broadcast_to(jnp.arange(dim), mi.shape)
        return out.at[jnp.clip(mi, 0, num_weights - 1), cols].add(jnp.where(valid, grad, 0))
    seg = offset2bag.reshape(-1).astype(jnp.int64)
    keep = jnp.ones((n,), jnp.bool_)
    if offsets is not None and offsets.shape[0] == nb + 1:  # include_last_offset
        keep = jnp.arange(n) < offsets.reshape(-1)[nb]
    if padding_idx is not None and padding_idx >= 0:
        keep = keep & (idx != padding_idx)
    rows = grad[jnp.clip(seg, 0, max(nb - 1, 0))]
    if per_sample_weights is not None and mode == 0:
        rows = rows * per_sample_weights.reshape(-1, 1).astype(rows.dtype)
    if mode == 1:
        rows = rows / jnp.maximum(bag_size[:nb][jnp.clip(seg, 0, max(nb - 1, 0))], 1)[:, None] \
            .astype(rows.dtype)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), rows.dtype).at[idx].add(keep.astype(rows.dtype))
        rows = rows / jnp.maximum(counts[idx], 1)[:, None]
    return out.at[idx].add(jnp.where(keep[:, None], rows, 0))


@lower(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode,
                                              padding_idx=-1):
    idx = indices.reshape(-1).astype(jnp.int64)
    n = idx.shape[0]
    nb = grad.shape[0]
    seg = jnp.clip(offset2bag.reshape(-1).astype(jnp.int64), 0, max(nb - 1, 0))
    keep = jnp.ones((n,), jnp.bool_)
    if offsets.shape[0] == nb + 1:  # include_last_offset
        keep = jnp.arange(n) < offsets.reshape(-1)[nb]
    if padding_idx is not None and padding_idx >= 0:
        keep = keep & (idx != padding_idx)
    w = jnp.take(weight, jnp.clip(idx, 0, weight.shape[0] - 1), axis=0)
    return jnp.where(keep, jnp.sum(opmath(grad[seg]) * opmath(w), axis=-1), 0).astype(grad.dtype)
