"""An event file writer over `events.py`: the records go to files in one log directory.

Files are named `events.out.tfevents.<epoch s>.<host>.<pid>.<seq>` (TensorBoard reads every file
with "tfevents" in its name, in name order; the zero-padded sequence keeps a process's files in
the order written). A file is closed and a new one started by `roll()`, and by the writer itself
once a file passes `max_file_bytes`, so the uploader re-sends a bounded amount when a file grows.
Not thread-safe: one thread writes (the harness's TensorBoard thread, or Determined's writer).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO, Optional

from harness.tensorboard.events import Scalar, file_version_record, scalar_record

DEFAULT_MAX_FILE_BYTES = 1 << 20


class EventFileWriter:
    def __init__(self, logdir: Path, *, clock: Callable[[], float] = time.time,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        self.logdir = Path(logdir)
        self._clock = clock
        self._max_file_bytes = max_file_bytes
        self._file: Optional[BinaryIO] = None
        self._written = 0
        self._seq = 0
        self._pending: list[bytes] = []
        self.paths: list[Path] = []  # every file this writer opened, in order

    def add_scalar(self, tag: str, value: float, step: int, wall_time: Optional[float] = None) -> None:
        """Buffer one scalar; `flush()` writes it."""
        self._pending.append(scalar_record(tag, value, int(step), self._clock() if wall_time is None else wall_time))

    def add_scalars(self, scalars: Iterable[Scalar]) -> None:
        now = self._clock()
        for tag, value, step in scalars:
            self._pending.append(scalar_record(tag, value, step, now))

    def _open(self) -> BinaryIO:
        self.logdir.mkdir(parents=True, exist_ok=True)
        now = self._clock()
        self._seq += 1
        name = f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.{self._seq:06d}"
        path = self.logdir / name
        f = open(path, "ab")
        f.write(file_version_record(now))
        self._written = f.tell()
        self.paths.append(path)
        return f

    def flush(self) -> None:
        """Write what is buffered to the current file (opening one if needed) and flush it."""
        if not self._pending:
            return
        if self._file is None:
            self._file = self._open()
        data = b"".join(self._pending)
        self._pending.clear()
        self._file.write(data)
        self._file.flush()
        self._written += len(data)
        if self._written >= self._max_file_bytes:
            self.roll()

    def roll(self) -> None:
        """Close the current file; the next flush starts a new one."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> None:
        self.flush()
        self.roll()
