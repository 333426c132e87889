"""An on-disk cache of joint graphs of named models, opt-in through ``REMAT_OPT_GRAPH_CACHE``.

Tracing a model costs seconds to minutes (`remat_opt.models.graphs`); planning it again at other
budgets or for other devices needs only the graph. With ``REMAT_OPT_GRAPH_CACHE=DIR`` set,
`remat_opt.models.graphs.analyze_spec` (the CLI, `analyze_model`) keeps each graph it traces in DIR,
keyed by what determines it: the model spec (with its traced depth), the executors, the versions
of torch, Thunder and litgpt, and a hash of remat-opt's own graph-building sources (so an edit to
them never serves a stale graph). Entries are written
atomically (several processes may share DIR); an unreadable entry is traced again. Processes that
want the same graph at once trace it once: `tracing_once` holds a lock per key while one traces,
and the others then read its entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import tempfile
import warnings
from importlib import metadata
from pathlib import Path

from remat_opt.core.graph import JointGraph

ENV_VAR = "REMAT_OPT_GRAPH_CACHE"
# remat-opt's sources that decide a traced graph, relative to the package root
_SOURCES = ("_compat.py", "tracing/extract.py", "tracing/dry_run.py", "tracing/storage.py", "tracing/op_semantics.py",
            "core/graph.py", "core/deepen.py", "core/layers.py", "models/by_name.py", "models/graphs.py",
            "distributed/regather_order.py", "distributed/collective_order.py", "distributed/data_parallel.py",
            "executors/sdpa_cpu.py", "executors/nvfuser_standin.py")  # fmt: skip


def graph_cache_dir() -> Path | None:
    """The cache directory from ``REMAT_OPT_GRAPH_CACHE``, or None (no caching)."""
    value = os.environ.get(ENV_VAR, "").strip()
    return Path(value) if value else None


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def cache_key(*parts: object) -> str:
    """A file-name-safe key of `parts`, library versions and remat-opt's graph-building sources."""
    digest = hashlib.sha256()
    for part in (*parts, *(_version(p) for p in ("torch", "lightning-thunder", "litgpt"))):
        digest.update(repr(part).encode())
    root = Path(__file__).parents[1]
    for source in _SOURCES:
        digest.update((root / source).read_bytes())
    return digest.hexdigest()[:32]


def load_graph(key: str) -> tuple[object, JointGraph] | None:
    """The cached ``(spec, graph)`` for `key`, or None (no cache, no entry, or an entry that does
    not load)."""
    directory = graph_cache_dir()
    path = directory / f"{key}.pkl" if directory else None
    if path is None or not path.exists():
        return None
    try:
        entry = pickle.loads(path.read_bytes())
    except Exception as e:  # a truncated or foreign file: trace again rather than trust it
        warnings.warn(f"{ENV_VAR}: ignoring unreadable {path} ({type(e).__name__}); tracing again", stacklevel=2)
        return None
    ok = isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], JointGraph)
    return entry if ok else None


def store_graph(key: str, spec: object, graph: JointGraph) -> None:
    """Writes ``(spec, graph)`` under `key` (atomically) when the cache is on."""
    directory = graph_cache_dir()
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, suffix=".tmp", delete=False) as f:
        f.write(pickle.dumps((spec, graph)))
    os.replace(f.name, directory / f"{key}.pkl")


@contextlib.contextmanager
def tracing_once(key: str):
    """Holds the cache's lock for `key` (an exclusive `fcntl.flock` on ``DIR/KEY.lock``) while the
    caller looks the graph up and, on a miss, traces and stores it: a second process asking for
    the same graph waits, then finds the entry. A no-op without the cache or without `fcntl`."""
    directory = graph_cache_dir()
    try:
        import fcntl
    except ImportError:  # not POSIX: concurrent misses trace twice, as before
        fcntl = None
    if directory is None or fcntl is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
