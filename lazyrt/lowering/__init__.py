"""ATen -> JAX lowerings, one module per op family. Importing this package fills
``_registry.LOWERINGS``."""
# Last: derives backward lowerings from the forward lowerings registered above.
from . import (  # noqa: F401
    _registry,
    attention,
    derived_backward,
    factories,
    fft,
    foreach,
    indexing,
    linalg,
    linalg_decomp,
    linalg_solvers,
    losses,
    nn,
    pointwise,
    pooling,
    random_ops,
    reductions,
    resampling,
    rnn,
    special,
    views,
)
from ._registry import LOWERINGS, lower  # noqa: F401
