import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

import lazyrt

MODES = ["strict", "defer"]


@pytest.fixture(params=MODES)
def mode(request):
    with lazyrt.set_mode(request.param):
        yield request.param
    lazyrt.sync()


@pytest.fixture(autouse=True)
def _no_fallback_and_clean():
    prev = lazyrt.config.cpu_fallback
    lazyrt.config.cpu_fallback = False
    yield
    lazyrt.config.cpu_fallback = prev
