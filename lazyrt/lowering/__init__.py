"""ATen -> JAX lowerings, one module per op family. Importing this package fills
``_registry.LOWERINGS``."""
from . import _registry  # noqa: F401
from . import (  # noqa: F401
    factories,
    foreach,
    indexing,
    linalg,
    nn,
    pointwise,
    random_ops,
    reductions,
    views,
)
from ._registry import LOWERINGS, lower  # noqa: F401
