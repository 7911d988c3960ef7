"""The agent's own credential, kept in its state directory.

The token the agent is started with (the pool's agent token, or an instance's bootstrap token) only
enrols it: the master answers the first registration of an agent id with a credential bound to that
id, and from then on refuses the enrolment token for it. The agent keeps that credential in
`<work_dir>/state/agent-credential` (directory 0700, file 0600, written atomically) and presents it
for registration, commands, events and logs, across restarts of the agent or of its host.

The file records the agent id and pool it belongs to: a work directory reused for another agent id
or pool does not hand that agent someone else's credential.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

log = logging.getLogger("shipyard.agent")

STATE_DIR = "state"
CREDENTIAL_FILE = "agent-credential"


class CredentialStore:
    def __init__(self, work_dir: Path, agent_id: str, pool: str) -> None:
        self.dir = work_dir / STATE_DIR
        self.path = self.dir / CREDENTIAL_FILE
        self.agent_id = agent_id
        self.pool = pool

    def load(self) -> str | None:
        """The stored credential of this agent id and pool, or None."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("event=credential_unreadable path=%s error=%r", self.path, type(e).__name__)
            return None
        if not isinstance(data, dict):
            return None
        if data.get("agentId") != self.agent_id or data.get("resourcePool") != self.pool:
            log.warning("event=credential_of_another_agent path=%s agent_id=%s pool=%s", self.path,
                        data.get("agentId"), data.get("resourcePool"))
            return None
        cred = data.get("credential")
        return cred if isinstance(cred, str) and cred else None

    def save(self, credential: str, cluster_id: str | None) -> None:
        """Atomically: a crash leaves the old file or the new one, never half of one."""
        self._private_dir()
        body = json.dumps({"agentId": self.agent_id, "resourcePool": self.pool, "clusterId": cluster_id,
                           "credential": credential}).encode()
        tmp = self.dir / f".{CREDENTIAL_FILE}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        # The mode is given at creation: there is no moment at which others could read it.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def forget(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _private_dir(self) -> None:
        self.dir.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            os.mkdir(self.dir, 0o700)
        except FileExistsError:
            # Ours alone: it holds a secret. (Only this subdirectory, never a work dir the
            # operator chose, whose mode is theirs.)
            os.chmod(self.dir, 0o700)
