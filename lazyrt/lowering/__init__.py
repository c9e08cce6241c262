"""ATen -> JAX lowerings, one module per op family. Importing this package fills
``_registry.LOWERINGS``."""
from . import (  # noqa: F401
    _registry,
    attention,
    factories,
    fft,
    foreach,
    indexing,
    linalg,
    linalg_decomp,
    losses,
    nn,
    pointwise,
    pooling,
    random_ops,
    reductions,
    rnn,
    special,
    views,
)
from ._registry import LOWERINGS, lower  # noqa: F401
