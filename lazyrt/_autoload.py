"""PyTorch's device-extension autoload entry point (the ``torch.backends`` group):
``import torch`` calls ``load``, and importing lazyrt registers the tpu device.

This module imports nothing at its top: ``import lazyrt`` itself imports torch, whose
autoload then imports this module while lazyrt is still being initialized.
"""


def load() -> None:
    import lazyrt  # noqa: F401
