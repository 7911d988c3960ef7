"""`det-agent` / `python -m agent_bootstrap.agent`: run the agent daemon.

Exit codes: 0 stopped by SIGTERM/SIGINT, 1 internal error, 2 bad configuration (or the work
directory is in use), 3 refused by the master (credential, pool), 4 the master was lost for good.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import IO

from agent_bootstrap.agent.config import AgentConfig, ConfigError, load_config
from agent_bootstrap.agent.daemon import EXIT_CONFIG, EXIT_INTERNAL, Agent
from agent_bootstrap.agent.devices import DeviceError, discover_slots
from agent_bootstrap.agent.runtime import (
    RuntimeOptions,
    RuntimeUnavailable,
    TaskRuntime,
    UnknownRuntime,
    create_runtime,
)

log = logging.getLogger("shipyard.agent")


class _AgentField(logging.Filter):
    def __init__(self, agent_id: str) -> None:
        super().__init__()
        self.agent_id = agent_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.agent_id = self.agent_id
        return True


def setup_logging(level: str, agent_id: str, stream: IO[str] | None = None) -> None:
    """One event per line, key=value, each tagged with the agent id."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter(
        "ts=%(asctime)s level=%(levelname)s logger=%(name)s agent_id=%(agent_id)s %(message)s"))
    handler.addFilter(_AgentField(agent_id))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request at info, the long-poll included.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)


def lock_work_dir(work_dir: Path) -> IO[bytes]:
    """An exclusive lock on the work dir, held for the agent's life: a second agent on the same
    directory would kill the first one's tasks as leftovers."""
    work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    f = open(work_dir / "agent.lock", "ab")  # held open until the process exits
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ConfigError(f"work_dir: {work_dir} is in use by another agent") from None
    f.truncate(0)
    f.write(str(os.getpid()).encode())
    f.flush()
    return f


def clean_work_dir(config: AgentConfig, runtime: TaskRuntime) -> None:
    """End what a previous agent on this work dir left running, and drop its task directories."""
    killed = runtime.clean_up_leftovers()
    if killed:
        log.warning("event=leftovers_killed processes=%d", killed)
    tasks_dir = config.task_dir or config.work_dir / "tasks"
    # The directories of tasks the runtime can reattach to (containers outlive their agent) stay.
    leftovers = getattr(runtime, "leftovers", list)()
    kept = {t.workdir.resolve() for t in leftovers if t.workdir is not None}
    if tasks_dir.is_dir() and not config.keep_task_dirs:
        for child in tasks_dir.iterdir():
            if child.resolve() not in kept:
                shutil.rmtree(child, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    try:
        config = load_config(argv)
        token = config.resolve_token()
    except ConfigError as e:
        print(f"det-agent: {e}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(config.log_level, config.agent_id)
    try:
        lock = lock_work_dir(config.work_dir)
    except (ConfigError, OSError) as e:
        print(f"det-agent: {e}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        try:
            runtime = create_runtime(config.runtime, RuntimeOptions(
                work_dir=config.work_dir, agent_id=config.agent_id, docker_host=config.docker_host,
                container_user=config.container_user, harness_libs=config.container_harness_libs))
        except UnknownRuntime as e:
            print(f"det-agent: {e}", file=sys.stderr)
            return EXIT_CONFIG
        except RuntimeUnavailable as e:
            # Exit 1, not 2: the engine may only be late (starting at boot); systemd tries again.
            print(f"det-agent: {e}", file=sys.stderr)
            return EXIT_INTERNAL
        clean_work_dir(config, runtime)
        try:
            slots = discover_slots(config.slot_type, config.slots)
        except DeviceError as e:
            runtime.close()
            print(f"det-agent: {e}", file=sys.stderr)
            return EXIT_CONFIG
        if config.slots and slots and slots[0].type == "cuda":
            log.warning("event=slots_option_ignored reason=%r", "--slots counts CPU slots; this host offers its GPUs")
        log.info("event=slots_discovered slots=%s", ",".join(f"{s.id}:{s.type}:{s.uuid or s.brand}" for s in slots))
        agent = Agent(config, token, slots, runtime)
        signal.signal(signal.SIGTERM, agent.on_signal)
        signal.signal(signal.SIGINT, agent.on_signal)
        return agent.run()
    finally:
        lock.close()


if __name__ == "__main__":
    sys.exit(main())
