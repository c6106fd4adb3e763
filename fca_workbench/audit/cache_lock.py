"""One audit at a time on a coefficient cache folder: a ``filelock`` lock file inside it.

Two audits on one cache folder (two users, or a rerun while the first still runs) would otherwise write the
same shards and manifests at once. The second waits up to ``--lock-wait`` seconds for the first to finish,
then stops with one line before it has written anything. Under torchrun rank 0 holds the lock for all ranks.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from fca_workbench.audit.distributed import SINGLE, EveryRankError, Ranks

LOCK_FILE = ".fca-audit.lock"


def lock_path(cache_root: str | Path) -> Path:
    """The lock file inside the cache folder (it travels with the folder, wherever it is mounted)."""
    return Path(cache_root) / LOCK_FILE


@contextmanager
def cache_lock(cache_root: str | Path, wait: float = 0.0, ranks: Ranks = SINGLE) -> Iterator[None]:
    """Hold the cache folder's lock (rank 0 for every rank) while the body runs; ``EveryRankError`` on every
    rank when another audit holds it for longer than ``wait`` seconds."""
    lock, refused = None, None
    if ranks.lead:
        Path(cache_root).mkdir(parents=True, exist_ok=True)
        lock = FileLock(lock_path(cache_root), timeout=wait)
        try:
            lock.acquire()
        except Timeout:
            lock, refused = (
                None,
                (
                    f"coefficient cache {cache_root} is in use by another audit (waited {wait:g} s); "
                    "let it finish, or give --lock-wait SECONDS to wait longer"
                ),
            )
    refused = ranks.from_lead(refused)
    if refused:
        raise EveryRankError(refused)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
