"""A bounded first-in-first-out spool of encoded reports on disk.

The metrics reporter moves reports here while the master is unreachable, so an outage of any
length costs disk (bounded by `max_bytes`) instead of memory, and replays them oldest first when
the master is back. One record per line: the reports are compact JSON (`_wire.dumps`), which never
holds a raw newline.

The file lives in the trial's own work dir (private to the trial's user, removed by the agent with
the task dir) and is deleted by `close()`. Nothing here survives the process: a trial that dies
reruns from its checkpoint and reports those steps again, and the master stores reports per
(trial, group, stepsCompleted), so a replay after a partial send duplicates nothing.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_COPY_CHUNK = 1 << 20


class MetricsSpool:
    """Not thread-safe: the reporter's sender thread is its only user."""

    def __init__(self, directory: str | Path, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        fd, name = tempfile.mkstemp(prefix=".shipyard-metrics-spool-", dir=str(directory))
        self.path = Path(name)
        self._f = os.fdopen(fd, "r+b")
        self.max_bytes = max_bytes
        self._read = 0  # offset of the oldest record
        self._write = 0  # end of the newest record
        self.count = 0  # records between the two

    @property
    def live_bytes(self) -> int:
        return self._write - self._read

    def append(self, records: list[bytes]) -> int:
        """Append records in order while they fit; return how many were taken (a prefix)."""
        taken = 0
        for rec in records:
            size = len(rec) + 1
            if self._write + size > self.max_bytes:
                if self._read == 0 or self.live_bytes + size > self.max_bytes:
                    break
                self._compact()
            self._f.seek(self._write)
            self._f.write(rec + b"\n")
            self._write += size
            self.count += 1
            taken += 1
        if taken:
            self._f.flush()
        return taken

    def peek(self, n: int) -> list[bytes]:
        """Up to `n` of the oldest records, without removing them."""
        out: list[bytes] = []
        self._f.seek(self._read)
        while len(out) < min(n, self.count):
            line = self._f.readline()
            if not line.endswith(b"\n"):
                raise OSError(f"metrics spool {self.path} is truncated")
            out.append(line[:-1])
        return out

    def pop(self, records: list[bytes]) -> None:
        """Remove `records`, which must be the oldest ones (as returned by `peek`)."""
        self._read += sum(len(r) + 1 for r in records)
        self.count -= len(records)
        if self.count <= 0:
            self.count = 0
            self._read = self._write = 0
            self._f.truncate(0)

    def _compact(self) -> None:
        """Move the live records to the start of the file (the destination is always behind the
        source, so copying forwards in chunks is safe)."""
        src, dst = self._read, 0
        while src < self._write:
            self._f.seek(src)
            chunk = self._f.read(min(_COPY_CHUNK, self._write - src))
            self._f.seek(dst)
            self._f.write(chunk)
            src += len(chunk)
            dst += len(chunk)
        self._f.truncate(dst)
        self._read, self._write = 0, dst

    def close(self) -> None:
        self._f.close()
        self.path.unlink(missing_ok=True)
