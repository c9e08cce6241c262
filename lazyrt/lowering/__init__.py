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

# isort: split
# Last: derives backward lowerings from the forward lowerings registered above.
from . import derived_backward  # noqa: F401
from ._registry import LOWERINGS, lower  # noqa: F401
