"""The Shipyard agent daemon (`det-agent`): registers a host's slots with the master, long-polls it
for start/kill commands, runs tasks as process groups and ships their logs.

Modules, top to bottom of the dependency order:
  config   options, YAML file and DET_AGENT_* environment, merged and validated
  devices  GPUs from nvidia-smi, else CPU slots
  client   the HTTP calls of docs/PROTOCOL.md (models: shipyard_common.agent_protocol) and their
           error taxonomy
  runtime  the TaskRuntime seam (start/signal/wait/release over an opaque handle), the registry of
           runtimes by name, and ProcessRuntime (process groups, pdeathsig, leftover cleanup)
  logship  line splitting and the batching, retrying log shipper
  daemon   the connection loop, command handling, task supervision and shutdown
"""

import sys

# The oldest Python the agent runs on (and the harness; the master needs 3.11). Checked first, in
# syntax every Python 3 parses, so an older interpreter gets this line and not a traceback.
MIN_PYTHON = (3, 9)
if sys.version_info < MIN_PYTHON:
    sys.stderr.write("the Shipyard agent needs Python {}.{} or newer; {} is {}.{}\n".format(
        *MIN_PYTHON, sys.executable, *sys.version_info[:2]))
    raise SystemExit(2)  # a configuration error: restarting cannot help (the unit's RestartPreventExitStatus)

try:  # the version the agent reports when it registers
    from importlib.metadata import version as _version

    __version__ = _version("shipyard")
except Exception:  # running from a source tree that is not installed
    __version__ = "0.1.0"
