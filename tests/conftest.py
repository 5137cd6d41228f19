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

# The files whose tests take longest here (measured with --durations on the two-worker
# suite), slowest first. `make test` hands whole files to its two workers in collection
# order (--dist loadfile --no-loadscope-reorder): these go out first so the short files fill
# the end, and neither worker is left running a long file alone at the end. A file not
# listed keeps its place after them; a listed file that no longer exists is ignored.
LONG_FILES = (
    "trainer/test_loop.py",
    "trainer/test_recipes.py",
    "trainer/test_pretrained.py",
    "trainer/test_rl.py",
    "test_multihost.py",
    "trainer/test_curriculum.py",
    "trainer/test_memory.py",
    "models/test_lora.py",
    "trainer/test_frozen_layers.py",
    "sweep/test_launch.py",
    "rollout/test_sampler.py",
    "rollout/test_episode.py",
)


def _long_file_rank(item) -> int:
    path = os.path.relpath(str(item.path), os.path.join(ROOT, "tests")).replace(os.sep, "/")
    return LONG_FILES.index(path) if path in LONG_FILES else len(LONG_FILES)


def pytest_collection_modifyitems(items):
    items.sort(key=_long_file_rank)  # stable: each file's tests keep their order
