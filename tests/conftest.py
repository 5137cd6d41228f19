import atexit
import os
import shutil
import sys
import tempfile

# Tests run from the repo root; make `configs` importable as a package.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# One persistent compilation cache for the whole test session: the pytest-xdist workers and
# every subprocess the tests start (runs killed and resumed, CLI calls, multi-host
# processes) inherit it through the environment, so a program that another process has
# compiled already is read back instead of compiled again. Made here, before JAX is
# imported; the process that made it removes it at exit. JAX_COMPILATION_CACHE_DIR set
# beforehand (to keep a cache between sessions) is used as it is.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="jaxrl-test-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    # Every program, however quick to compile: the tiny models' programs compile in well
    # under JAX's default threshold of one second each, and there are thousands.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
