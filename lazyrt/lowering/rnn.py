"""Fused recurrent cells. ``nn.LSTM`` / ``nn.GRU`` on a PrivateUse1 device take
ATen's fused-cell path (as on CUDA): the gate matmuls run as ordinary ``linear``
ops and only the pointwise cell update is one op. The ``workspace`` outputs are
private to this file: each forward stores what its own backward reads.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ._registry import aten, lower


def _sum0(x):
    return jnp.sum(x, axis=0)


@lower(aten._thnn_fused_lstm_cell.default)
def thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * cx + i * g
    hy = o * jnp.tanh(cy)
    workspace = jnp.concatenate([i, f, g, o], axis=-1)  # activated gates
    return hy, cy, workspace


@lower(aten._thnn_fused_lstm_cell_backward_impl.default)
def thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = jnp.split(workspace, 4, axis=-1)
    tanh_cy = jnp.tanh(cy)
    gcx = jnp.zeros_like(cy) if grad_cy is None else grad_cy
    go = jnp.zeros_like(cy)
    if grad_hy is not None:
        gcx = gcx + grad_hy * o * (1 - tanh_cy * tanh_cy)
        go = grad_hy * tanh_cy
    di = gcx * g * i * (1 - i)
    df = gcx * cx * f * (1 - f)
    dg = gcx * i * (1 - g * g)
    do = go * o * (1 - o)
    grad_gates = jnp.concatenate([di, df, dg, do], axis=-1)
    grad_cx = gcx * f
    return grad_gates, grad_cx, (_sum0(grad_gates) if has_bias else None)


@lower(aten._thnn_fused_gru_cell.default)
def thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    ir, iz, in_ = jnp.split(input_gates, 3, axis=-1)
    hr, hz, hn = jnp.split(hidden_gates, 3, axis=-1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    hy = n + z * (hx - n)
    workspace = jnp.concatenate([r, z, n, hx, hn], axis=-1)
    return hy, workspace


@lower(aten._thnn_fused_gru_cell_backward.default)
def thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = jnp.split(workspace, 5, axis=-1)
    dz = grad_hy * (hx - n) * z * (1 - z)
    dn = grad_hy * (1 - z) * (1 - n * n)
    ghx = grad_hy * z
    dr = dn * hn * r * (1 - r)
    grad_input_gates = jnp.concatenate([dr, dz, dn], axis=-1)
    grad_hidden_gates = jnp.concatenate([dr, dz, dn * r], axis=-1)
    if has_bias:
        return (grad_input_gates, grad_hidden_gates, ghx,
                _sum0(grad_input_gates), _sum0(grad_hidden_gates))
    # Zeros, not None (undefined), for the absent biases: this op has no meta kernel, and
    # the dispatcher's shape inference (jax.eval_shape) cannot express an undefined output.
    # Autograd drops them (the bias inputs are None).
    zb = jnp.zeros(grad_input_gates.shape[-1:], grad_input_gates.dtype)
    return grad_input_gates, grad_hidden_gates, ghx, zb, zb
