"""One writer at a time on a folder: a ``filelock`` lock file inside it (``layout.LOCK_FILE``).

Two audits on one cache folder or one output folder (two users, or a rerun while the first still runs) would
otherwise write the same shards, manifests or ``audit.json`` at once. The second waits up to ``--lock-wait``
seconds for the first to finish, then stops with one line before it has written anything. Under torchrun
rank 0 holds the lock for all ranks.
"""

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from fca_workbench.audit.distributed import SINGLE, Ranks
from fca_workbench.audit.torchrun import EveryRankError
from fca_workbench.results.layout import LOCK_FILE

WAIT_HINT = "let it finish, or give --lock-wait SECONDS to wait longer"


def lock_path(folder: str | Path) -> Path:
    """The lock file inside the folder (it travels with the folder, wherever it is mounted)."""
    return Path(folder) / LOCK_FILE


@contextmanager
def folder_lock(
    folder: str | Path,
    what: str,
    wait: float = 0.0,
    ranks: Ranks = SINGLE,
    holder: str = "audit",
    hint: str = WAIT_HINT,
) -> Iterator[None]:
    """Hold ``folder``'s lock (rank 0 for every rank) while the body runs; ``EveryRankError`` on every rank,
    naming ``what`` the folder is, when another ``holder`` holds it for longer than ``wait`` seconds."""
    lock, refused = None, None
    if ranks.lead:
        Path(folder).mkdir(parents=True, exist_ok=True)
        lock = FileLock(lock_path(folder), timeout=wait)
        try:
            lock.acquire()
        except Timeout:
            lock, refused = None, f"{what} {folder} is in use by another {holder} (waited {wait:g} s); {hint}"
    refused = ranks.from_lead(refused)
    if refused:
        raise EveryRankError(refused)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def cache_lock(cache_root: str | Path, wait: float = 0.0, ranks: Ranks = SINGLE) -> AbstractContextManager[None]:
    """The coefficient cache folder's lock (``folder_lock``)."""
    return folder_lock(cache_root, "coefficient cache", wait, ranks)
