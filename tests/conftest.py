import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# NOTE: the tests never read or fill a persistent compile cache (the user's or a shared
# one): off for this process and the subprocesses it starts, which inherit this; the
# cache's own tests give their processes a directory each (tests/test_compile_cache.py).
os.environ["LAZYRT_CACHE_DIR"] = "off"

import pytest

import lazyrt

# (also when lazyrt was imported before this file, e.g. by a plugin, and read another dir)
lazyrt.config.cache_dir = "off"

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


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches empty before and after the test (modules of compile tests use it for
    every test: ``pytestmark = pytest.mark.usefixtures("fresh_dynamo")``)."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def defer_mode():
    """The test runs in defer mode; what it left pending is flushed at its end."""
    with lazyrt.set_mode("defer"):
        yield
        lazyrt.sync()
