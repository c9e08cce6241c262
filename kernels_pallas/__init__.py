"""Pallas reference kernels for lazyrt: flash attention, tiled matmul, ragged paged attention.

Every kernel runs compiled on gpu/tpu and in Pallas interpret mode on CPU (the choice is
:func:`default_interpret`; each kernel takes ``interpret=`` to override it). Each has a
plain ``jax.numpy`` ``*_reference`` with the same signature, and a ``supports_*``
predicate a router can ask before dispatching (it never raises, whereas the kernels raise
``ValueError`` on inputs they cannot take).
"""

from kernels_pallas._common import default_interpret
from kernels_pallas.flash_attention import (
    BlockSizes,
    flash_attention,
    flash_attention_reference,
    supports_attention,
)
from kernels_pallas.matmul import (
    ACTIVATIONS,
    MatmulBlockSizes,
    batched_matmul,
    matmul,
    matmul_reference,
    supports_matmul,
)
from kernels_pallas.paged_attention import paged_attention, paged_attention_reference

__all__ = [
    "ACTIVATIONS",
    "BlockSizes",
    "MatmulBlockSizes",
    "batched_matmul",
    "default_interpret",
    "flash_attention",
    "flash_attention_reference",
    "matmul",
    "matmul_reference",
    "paged_attention",
    "paged_attention_reference",
    "supports_attention",
    "supports_matmul",
]
