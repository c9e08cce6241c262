import atexit
import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# NOTE: the tests never read or fill the user's persistent compile cache: each test process
# (and the subprocesses it starts, which inherit this) uses a fresh directory of its own.
_CACHE = tempfile.mkdtemp(prefix="lazyrt-test-cache-")
os.environ["LAZYRT_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

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
