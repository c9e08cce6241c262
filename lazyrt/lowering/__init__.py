"""ATen -> JAX lowerings, one module per op family. Importing this package fills
``_registry.LOWERINGS``."""
from . import _registry  # noqa: F401
from . import (  # noqa: F401
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
    resampling,
    reductions,
    rnn,
    special,
    views,
)
# Last: derives backward lowerings from the forward lowerings registered above.
from . import derived_backward  # noqa: F401,E402
from ._registry import LOWERINGS, lower  # noqa: F401
