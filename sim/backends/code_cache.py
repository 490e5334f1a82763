"""A disk cache of the Python code the Amaranth-simulator engine compiles, one file per generated source.

Building a simulator of the fast chip spends about half its time turning the ~885 functions pysim
generates (one per process) into code objects: parsing them, rewriting them
(`sim.backends.amaranth_engine`'s `_compile_inlined`) and compiling them. That work depends only on the
generated source, on the rewriter and on the Python that compiles it, so its result is kept: a code object
is stored with ``marshal`` under the SHA-256 of (that Python's bytecode magic number, the rewriter's own
source, the generated source). A stored entry is therefore only ever used for the very source it was made
from by the very rewriter that made it; a changed engine or another Python misses and compiles afresh.

The key is per source and not per design because pysim numbers its signals in an order that varies with
Python's string hashing (a few processes' sources differ from run to run): the rest still hit.

Where: ``$GA2_PYSIM_CACHE`` if set (``off`` turns the cache off), else ``pysim/`` under the build directory
(``$GA2_BUILD_DIR`` or ``<repo>/build``, beside the Verilator models). Entries are written to a temporary
file and renamed into place, so concurrent builders (pytest workers, the server's threads) never see half
a file; an entry that cannot be read is a miss, and a directory that cannot be written only costs the
time. Delete the directory to empty the cache.
"""
from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import tempfile
import types
from pathlib import Path

from sim.backends import build_base

__all__ = ["CodeCache", "default_cache_dir"]


def default_cache_dir() -> Path | None:
    """The cache's directory (see the module's docstring), or None when ``$GA2_PYSIM_CACHE`` is ``off``."""
    env = os.environ.get("GA2_PYSIM_CACHE")
    if env is not None:
        return None if env.strip().lower() in ("off", "0", "no", "") else Path(env)
    return build_base() / "pysim"


class CodeCache:
    """Code objects compiled from generated sources, kept on disk under a key of the source and a `salt`.

    Parameters
    ----------
    root : Path or None
        The directory of the entries; None keeps nothing (every call compiles).
    salt : bytes
        What else the compiled code depends on (the compiler's own source); the Python's bytecode magic
        number is added here.

    Attributes
    ----------
    hits, misses : int
        Entries found and compiled since this object was made.
    """

    def __init__(self, root, salt: bytes):
        self.root = None if root is None else Path(root)
        self._salt = importlib.util.MAGIC_NUMBER + hashlib.sha256(salt).digest()
        self.hits = 0
        self.misses = 0

    def _path(self, source: str) -> Path:
        digest = hashlib.sha256(self._salt + source.encode()).hexdigest()
        return self.root / digest[:2] / f"{digest[2:]}.code"

    def compile(self, compile_fn, source: str, filename: str, mode: str):
        """``compile_fn(source, filename, mode)``, or the code object it returned for the same `source` before.

        `filename` and `mode` are not part of the key: the engine compiles every source with the same
        ones (pysim's ``"<string>"`` and ``"exec"``; a dump file's name when ``AMARANTH_pysim_dump`` is
        set, which only names the code in tracebacks)."""
        if self.root is None:
            return compile_fn(source, filename, mode)
        path = self._path(source)
        try:
            code = marshal.loads(path.read_bytes())
        except (OSError, EOFError, ValueError, TypeError):
            code = None
        if isinstance(code, types.CodeType):
            self.hits += 1
            return code
        self.misses += 1
        code = compile_fn(source, filename, mode)
        self._store(path, marshal.dumps(code))
        return code

    @staticmethod
    def _store(path: Path, data: bytes) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            pass                                  # not writable: the cache only saves time
