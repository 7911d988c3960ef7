"""Copies a trial's TensorBoard files to its checkpoint storage, where TensorBoard tasks read them.

Determined's layout and moments (determined/tensorboard/base.py, build.py):

- locally, `<checkpoint_storage.base_path or the trial's work dir>/tensorboard-<allocation>-<rank>/`;
- in the storage, `<cluster_id>/tensorboard/experiment/<exp>/trial/<trial>/<relative path>` under
  the shared_fs directory (host_path/storage_path) or the bucket's prefix;
- a sync after metric reports, at most once a second (cloud request quotas), by a background
  thread; a final one when the trial's Core API closes.

A pass uploads every TensorBoard file (Determined's name patterns) whose size or mtime changed
since it was last uploaded: requests that pile up while a pass runs become one pass, and a
failed upload is retried by the next pass (its signature is only recorded on success).
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Optional

from harness.storage import CheckpointStorage
from shipyard_common.tensorboard_paths import sync_path  # noqa: F401 (this module's API)

log = logging.getLogger("harness.tensorboard")

# Determined's `tb_file_types` (determined/tensorboard/util.py).
TB_FILE_PATTERNS = ("*tfevents*", "*.trace.json.gz", "*.trace.json", "*.memory_profile.json.gz", "*.pb")

Selector = Callable[[Path], bool]
Mangler = Callable[[Path, int], Path]


def local_path(storage_config: Mapping[str, Any], allocation_id: Optional[str], rank: int) -> Path:
    """A new directory where this process writes them: Determined's `get_base_path` (under
    checkpoint_storage.base_path, else the temp dir), made unique per process, since on the
    process runtime the trials of a host share its /tmp."""
    root = storage_config.get("base_path") or None
    if root:
        Path(root).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"tensorboard-{allocation_id or 'local'}-{rank}-", dir=root))


def tb_files(base: Path) -> list[Path]:
    if not base.exists():
        return []
    found = {p for pattern in TB_FILE_PATTERNS for p in base.rglob(pattern) if p.is_file()}
    return sorted(found)


class TensorboardSync:
    """The uploader: `request()` from any thread, `close()` for the final pass."""

    def __init__(self, storage: CheckpointStorage, base_path: Path, storage_path: str, *, rank: int = 0,
                 min_interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.storage = storage
        self.base_path = Path(base_path)
        self.storage_path = storage_path
        self.rank = rank
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._uploaded: dict[Path, tuple[int, int]] = {}
        self._cond = threading.Condition()
        self._requests: list[tuple[Optional[Selector], Optional[Mangler]]] = []
        self._last_pass = -float("inf")
        self._stopping = False
        self._thread: Optional[threading.Thread] = None
        self.passes = 0  # passes that found something to upload
        self.uploads = 0  # files uploaded
        self.failures = 0  # files whose upload failed (retried by the next pass)

    def start(self) -> TensorboardSync:
        self._thread = threading.Thread(target=self._run, name="harness-tensorboard-sync", daemon=True)
        self._thread.start()
        return self

    def request(self, selector: Optional[Selector] = None, mangler: Optional[Mangler] = None) -> None:
        """Ask for a pass (non-blocking). It starts at least `min_interval_s` after the last one."""
        with self._cond:
            if (selector, mangler) not in self._requests:
                self._requests.append((selector, mangler))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping:
                    wait = self._last_pass + self._min_interval_s - self._clock()
                    if self._requests and wait <= 0:
                        break
                    self._cond.wait(wait if self._requests else None)
                if self._stopping:
                    return
                requests, self._requests = self._requests, []
                self._last_pass = self._clock()
            for selector, mangler in requests:
                self.sync_once(selector, mangler)

    def sync_once(self, selector: Optional[Selector] = None, mangler: Optional[Mangler] = None) -> int:
        """One pass in the calling thread: upload what changed; the number of files uploaded."""
        n = 0
        for path in tb_files(self.base_path):
            if selector is not None and not selector(path):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            signature = (st.st_size, st.st_mtime_ns)
            if self._uploaded.get(path) == signature:
                continue
            rel = path.relative_to(self.base_path)
            if mangler is not None:
                rel = mangler(rel, self.rank)
            key = f"{self.storage_path}/{PurePosixPath(*rel.parts)}"
            try:
                self.storage.upload_file(path, key)
            except Exception as e:  # noqa: BLE001 (any storage error: the next pass retries)
                self.failures += 1
                log.warning("event=tensorboard_upload_failed file=%s storage=%s error=%s: %s",
                            path.name, self.storage.describe(), type(e).__name__, e)
                continue
            self._uploaded[path] = signature
            n += 1
        if n:
            self.passes += 1
            self.uploads += n
        return n

    def close(self, final_pass: bool = True) -> int:
        """Stop the thread (waiting for a pass in flight), then a last pass in this thread."""
        with self._cond:
            self._stopping = True
            pending, self._requests = self._requests, []
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        n = 0
        for selector, mangler in pending:
            n += self.sync_once(selector, mangler)
        if final_pass:
            n += self.sync_once()
        return n
