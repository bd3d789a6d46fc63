"""The one engine that runs long work: ``check``, ``sweep`` and ``calibrate`` hand it tasks and get records back.

A task is any picklable object with a ``key`` (a content hash of what determines its result) and a ``run()``
method returning a JSON-ready record. The engine runs pending tasks in this process, in joblib's worker
processes (loky) or on a Dask cluster, and yields each record as its task finishes; the caller writes it at once
to a :class:`ResultStore`, so an interrupted run loses only the tasks that were still running and a rerun
computes only what is missing.

Every task runs with BLAS on one thread (:func:`one_blas_thread`), wherever it runs: OpenBLAS may split a
reduction across its threads and sum it in another order, so the thread count must be fixed for a result to be
the same bit for bit in this process, in a worker and on a cluster (Dask's workers start with one thread, this
process would otherwise use every core). Several workers each with one BLAS thread also keep a laptop from
running cores × cores threads.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

__all__ = ["RUN_ID", "ResultStore", "write_atomically", "run_tasks", "execute", "one_blas_thread", "worker_count",
           "checksum"]

# Identifies the process that computed a record (the kill-and-resume tests use it).
RUN_ID = uuid.uuid4().hex


# ==================================================================================================
# Running tasks
# ==================================================================================================


@contextlib.contextmanager
def one_blas_thread():
    """BLAS and OpenMP limited to one thread while the block runs (threadpoolctl), then restored."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


def execute(task) -> dict:
    """Run one task and return its record (top-level, so joblib and Dask workers can import it)."""
    with one_blas_thread():
        return task.run()


def worker_count(n_jobs: int, tasks: int) -> int:
    """The number of worker processes ``n_jobs`` asks for (``-1``: every core this process may use), never more
    than there are tasks."""
    from joblib import cpu_count

    if isinstance(n_jobs, bool) or int(n_jobs) != n_jobs or not (n_jobs == -1 or n_jobs >= 1):
        raise ValueError(f"n_jobs (--jobs) must be a number of workers >= 1, or -1 for every core; got {n_jobs}")
    return max(1, min(cpu_count() if n_jobs < 0 else int(n_jobs), tasks))


def run_tasks(pending: list, *, n_jobs: int = 1, scheduler: str | None = None, on_start=None):
    """Yield the record of every task in ``pending`` as it finishes (in completion order).

    Tasks start in the order given (callers put the longest first). ``scheduler`` is the address of a
    ``dask.distributed`` scheduler; otherwise ``n_jobs`` workers of joblib's process pool run them, or this
    process itself when ``n_jobs`` is 1 or there is one task (``on_start(task)`` is then called before each starts).
    On Ctrl-C, SIGTERM or an error the queued tasks are
    cancelled and the running ones killed; what was yielded before is the caller's to keep."""
    if not pending:
        return
    if scheduler is not None:
        yield from _run_on_dask(pending, scheduler)
        return
    if worker_count(n_jobs, len(pending)) == 1:
        for task in pending:
            if on_start is not None:
                on_start(task)
            yield execute(task)
        return
    yield from _run_in_workers(pending, worker_count(n_jobs, len(pending)))


def _run_on_dask(pending: list, scheduler: str):
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise ValueError("--scheduler needs the dask extra: pip install 'attnflow[dask]'") from None
    try:
        client = Client(scheduler)
    except (OSError, TimeoutError) as error:
        raise ValueError(f"--scheduler: cannot connect to {scheduler!r} ({error})") from None
    with client:
        # a higher priority starts first: the caller's order, longest first
        futures = [client.submit(execute, task, pure=False, priority=len(pending) - index)
                   for index, task in enumerate(pending)]
        try:
            for future in as_completed(futures):
                yield future.result()
        except BaseException:
            client.cancel(futures)
            raise


PARENT_POLL_SECONDS = 0.25


def _exit_with_parent(parent: int) -> None:
    """Worker initializer: end this worker as soon as the process that started it is gone (a SIGKILL of the
    run included), instead of computing on for nobody."""
    import threading

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="attnflow-parent-watch").start()


def _run_in_workers(pending: list, workers: int):
    """joblib's process pool (loky), whose workers die with the run: on an interrupt the pending tasks are
    cancelled and the running ones killed at once, and each worker watches its parent in case the run itself is
    killed. Finished records have already been yielded (and written) by then."""
    from concurrent.futures import as_completed

    from joblib.externals.loky import get_reusable_executor

    _quiet_resource_tracker()
    executor = get_reusable_executor(max_workers=workers, kill_workers=True, initializer=_exit_with_parent,
                                     initargs=(os.getpid(),), reuse=False)
    futures = [executor.submit(execute, task) for task in pending]
    try:
        for future in as_completed(futures):
            yield future.result()
    except BaseException:  # Ctrl-C, SIGTERM, a failing task, or the consumer closing the generator
        _forget_queued_task_ids(executor)
        executor.shutdown(wait=False, kill_workers=True)  # cancels what has not started, kills what has
        raise


# loky's resource tracker, a process of its own, warns when a semaphore of a worker killed by the shutdown above is
# already gone ("resource_tracker: /loky-…: FileNotFoundError") or was left behind; under load that line could follow
# the one-line error of a failing task. The tracker takes its warning filters from this process's -W options
# (multiprocessing.util._args_from_interpreter_flags), so the filter is added to them before the pool starts.
_RESOURCE_TRACKER_NOISE = "ignore:resource_tracker:UserWarning"


def _quiet_resource_tracker() -> None:
    if _RESOURCE_TRACKER_NOISE not in sys.warnoptions:
        sys.warnoptions.append(_RESOURCE_TRACKER_NOISE)


def _forget_queued_task_ids(executor) -> None:
    """Empty the pool's queue of task ids before a killing shutdown. loky's shutdown with ``kill_workers`` drops the
    tasks that have not started but not their ids, and its manager thread then looks the next id up and dies on a
    KeyError, whose traceback was printed after "interrupted". The tasks themselves are still cancelled."""
    ids = getattr(executor, "_work_ids", None)
    if ids is None:  # another loky: nothing to do but let it print
        return
    try:
        while True:
            ids.get_nowait()
    except queue.Empty:
        pass


# ==================================================================================================
# The store
# ==================================================================================================


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``: a reader never sees half a
    file, and a failed write leaves no temporary behind. The file is readable by others (mkstemp's 0600 is for
    secrets; records and tables are for readers)."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


STALE_TEMPORARY_SECONDS = 3600  # a temporary file this old belongs to no writer that is still running


def checksum(record: dict) -> str:
    body = {k: v for k, v in record.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()


class ResultStore:
    """One JSON file per finished task in ``directory`` (``<key>.json``), written atomically.

    Each record carries its own key and a SHA-256 checksum of its content. A record that is truncated, empty,
    not an object, missing one of ``fields``, stored under another task's key, fails its checksum, or is not a
    regular file is never used: it is moved aside to ``directory/corrupt/`` (named in ``quarantined``) and its task
    runs again. Temporary files left by a writer that died are removed when the store is opened.
    ``directory=None`` keeps records in memory only (for claims that run a small sweep themselves).
    """

    def __init__(self, directory=None, *, fields: tuple = ("key",)):
        self.directory = None if directory is None else Path(directory)
        self.fields = tuple(dict.fromkeys(("key", *fields)))
        self._memory: dict[str, dict] = {}  # every record without a directory; with one, those checked sound
        self.quarantined: list[str] = []
        if self.directory is not None:
            if str(directory).strip() == "":
                raise ValueError("the store directory must be a non-empty path")
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                probe = tempfile.NamedTemporaryFile(dir=self.directory, prefix=".tmp-probe-", delete=True)
                probe.close()
            except OSError as error:
                raise ValueError(f"cannot write the result store {str(directory)!r} "
                                 f"({error.strerror or error})") from None
            self._remove_stale_temporaries()

    def _remove_stale_temporaries(self) -> None:
        now = time.time()
        for path in self.directory.glob(".tmp-*"):
            try:
                if now - path.stat().st_mtime > STALE_TEMPORARY_SECONDS:
                    path.unlink()
            except OSError:  # another process removed or renamed it meanwhile
                pass

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def _problem(self, key: str) -> str | None:
        """Why the stored record for ``key`` cannot be used, or None when it is sound (it is then kept, so that
        loading it does not read and check the file a second time)."""
        path = self._path(key)
        if not path.is_file():
            return "not a regular file"
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            return f"unreadable JSON ({type(error).__name__})"
        if not isinstance(record, dict):
            return f"a JSON {type(record).__name__}, not a record"
        missing = [f for f in (*self.fields, "checksum") if f not in record]
        if missing:
            return f"missing {', '.join(missing)}"
        if record["key"] != key:
            return f"the record of another task ({record['key']})"
        try:
            if record["checksum"] != checksum(record):
                return "checksum mismatch"
        except ValueError:  # non-finite numbers: not something this store writes
            return "non-finite numbers"
        self._memory[key] = record
        return None

    def _quarantine(self, key: str, reason: str) -> None:
        path = self._path(key)
        corrupt = self.directory / "corrupt"
        corrupt.mkdir(exist_ok=True)
        target = corrupt / f"{key}.{uuid.uuid4().hex[:8]}.json"
        shutil.move(str(path), str(target))  # a file or whatever stands in its place (a directory, a link)
        self.quarantined.append(f"{path.name}: {reason} (moved to {target.relative_to(self.directory)})")

    def has(self, key: str) -> bool:
        """Whether a sound record of ``key`` is stored; an unsound one is moved aside first."""
        if self.directory is None or key in self._memory:
            return key in self._memory
        if not os.path.lexists(self._path(key)):
            return False
        reason = self._problem(key)
        if reason is None:
            return True
        self._quarantine(key, reason)
        return False

    def write(self, record: dict) -> None:
        record = dict(record, checksum=checksum(record))
        self._memory[record["key"]] = record
        if self.directory is None:
            return
        write_atomically(self._path(record["key"]), json.dumps(record, indent=1, allow_nan=False))

    def load(self, key: str) -> dict:
        if key not in self._memory:
            reason = "absent" if self.directory is None else self._problem(key)
            if reason is not None:
                raise ValueError(f"the stored record of task {key} cannot be used: {reason}")
        return self._memory[key]

    def keys(self) -> list[str]:
        """The keys of the records in the directory (sound or not; :meth:`has` checks one)."""
        if self.directory is None:
            return list(self._memory)
        return sorted(path.stem for path in self.directory.glob("*.json") if not path.name.startswith(".tmp-"))
