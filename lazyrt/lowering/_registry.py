"""The ATen -> JAX lowering table.

One pure JAX function per ATen overload, registered with ``@lower``. The same
function serves strict mode (jit of one op) and defer mode (traced into the
flush's single computation), so a lowering must be a pure function of its JAX
array arguments.

Calling convention of a lowering
--------------------------------
* Arguments arrive exactly as the ATen schema names them (positional args
  positionally, kwarg-only args as keywords), with every ``Tensor`` replaced by a
  ``jax.Array`` (``Tensor[]`` by a list of arrays, ``Tensor?`` by an array or
  None). Python ``float`` arguments are *runtime* values (JAX tracers), so a
  learning rate that changes every step compiles nothing new: never branch on
  them in Python. Register with ``static_floats=True`` when a float decides a
  shape (``arange``, upsampling scale factors). ``int``/``bool``/``str``/lists of
  ints/dtypes are static Python values.
* A ``Generator?`` argument arrives as a JAX PRNG key (``jax.random.PRNGKey``
  style uint32[2]) built from lazyrt's RNG state; use it, never a constant key.
* ``dtype`` arguments arrive as ``torch.dtype``; use ``to_jax_dtype``.
* Return: an array, or a tuple/list matching the schema's returns. Outputs are
  cast to the dtype PyTorch's meta kernel computes, so a lowering may return a
  wider dtype, but shapes must be exact.
* An op with mutable arguments (``add_``, ``_foreach_add_``, ``_fused_adamw_``)
  returns ``(*fresh_outputs, *new_values_of_mutable_args)``: first the schema
  returns that do not alias a mutated argument, then the new value of every
  mutated argument in schema order (a list for ``Tensor(a!)[]``). With a single
  mutated argument and no fresh output the bare new value may be returned. The
  runtime writes those values back (through views too). In-place ``foo_`` and
  ``foo.out`` variants need no lowering: they are derived from ``foo``.

Ops not every supported torch has
---------------------------------
``aten`` and ``prims`` here are ``lazyrt._base.compat``'s namespaces: an op or overload the
running torch lacks is a ``MissingOp``, whose ``@lower`` / ``@inverse`` registration is
skipped (and listed by ``lazyrt.coverage()["skipped"]``), so a lowering module imports on
every torch in lazyrt's range without asking for each op.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from torch._ops import OpOverload, OpOverloadPacket

from .._base import compat
from .._base.dtypes import to_jax as to_jax_dtype

__all__ = ["Lowering", "lower", "named", "LOWERINGS", "get_lowering", "to_jax_dtype", "inverse",
           "INVERSES", "prims"]


@dataclasses.dataclass(frozen=True, slots=True)
class Lowering:
    op: OpOverload
    fn: Callable
    # Floats of this op are compile-time constants (they decide shapes).
    static_floats: bool = False
    # Names of arguments this op mutates although its schema does not say so
    # (``native_batch_norm``'s running stats). None: read from the schema.
    mutates: tuple[str, ...] | None = None
    # Output shape depends on input *values* (nonzero, unique, masked_select):
    # the lowering runs on concrete arrays, outside jit, at a sync point.
    data_dependent: bool = False
    # Random although the schema has no Generator argument (native_dropout):
    # the lowering gets a ``generator`` PRNG key keyword.
    random: bool = False


LOWERINGS: dict[OpOverload, Lowering] = {}


def _overloads(op) -> Iterable[OpOverload]:
    op = compat.unwrap(op)
    if isinstance(op, compat.MissingOp):
        # NOTE: an op the running torch does not have: nothing to register
        compat.skip(op.name, f"not an op of torch {compat.TORCH}")
        return ()
    if isinstance(op, OpOverload):
        return (op,)
    if isinstance(op, OpOverloadPacket):
        return tuple(getattr(op, name) for name in op.overloads())
    raise TypeError(f"@lower takes OpOverload or OpOverloadPacket, got {op!r}")


def lower(*ops, static_floats: bool = False, mutates: tuple[str, ...] | None = None,
          data_dependent: bool = False, random: bool = False, replace: bool = False):
    """Register the decorated function as the lowering of every given op.

    An ``OpOverloadPacket`` (``aten.add``) registers every overload of it that
    has no lowering yet; an ``OpOverload`` (``aten.add.Tensor``) registers that
    one. Registering the same overload twice is an error unless ``replace``.
    """

    def deco(fn: Callable) -> Callable:
        for op in ops:
            packet = isinstance(compat.unwrap(op), OpOverloadPacket)
            for ov in _overloads(op):
                if ov in LOWERINGS and not replace:
                    if packet:
                        continue
                    raise ValueError(f"lazyrt: duplicate lowering for {ov}")
                LOWERINGS[ov] = Lowering(ov, fn, static_floats, mutates, data_dependent, random)
        return fn

    return deco


def named(fn: Callable, name: str) -> Callable:
    """``fn`` under ``name``: a lowering made in a loop (one function per op) keeps a
    findable name (``lazyrt.coverage(op).by`` shows it with its file and line)."""
    fn.__name__ = fn.__qualname__ = name
    return fn


def get_lowering(op: OpOverload) -> Lowering | None:
    return LOWERINGS.get(op)


# How a write into a view scatters into its base, per view op: ``fn(base, new) -> base'``
# (``base`` the value the view was taken of, ``new`` the view's new value). A view op with
# no entry here gets the runtime's generic inverse (``lazyrt._exec.views``): push an iota of the
# base through the view's own lowering and scatter.
INVERSES: dict[OpOverload, Callable] = {}


def inverse(*ops):
    """Register the decorated ``fn(base, new)`` as the inverse of these view ops (an
    ``OpOverloadPacket`` registers every overload)."""

    def deco(fn: Callable) -> Callable:
        for op in ops:
            for ov in _overloads(op):
                INVERSES[ov] = fn
        return fn

    return deco


aten = compat.aten
prims = compat.prims
