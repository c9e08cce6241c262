import atexit
import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# NOTE: the tests run with the persistent compile cache on, as users do, but never with the
# user's (or any shared) one: a fresh directory per test process, inherited by the
# subprocesses it starts and deleted at its exit. The cache's own tests give their
# processes a directory each (tests/test_compile_cache.py).
_CACHE = tempfile.mkdtemp(prefix="lazyrt-test-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ["LAZYRT_CACHE_DIR"] = _CACHE

import pytest  # noqa: E402

import lazyrt  # noqa: E402

# (also when lazyrt was imported before this file, e.g. by a plugin, and read another dir)
lazyrt.config.cache_dir = _CACHE

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
