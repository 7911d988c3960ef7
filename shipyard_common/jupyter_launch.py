"""A notebook task's entrypoint (issue 29): start JupyterLab on a free port of the agent, wait until
it answers, tell the master where it serves (`POST /api/v1/allocations/{id}/proxy_address`, with
the task's own token), then wait for it, passing a stop signal on.

Standard library only, and run as `python3 -c <this file's text>` by the master's task spec, so it
works in the agent's environment and in any image that has Python and JupyterLab. Jupyter serves
under the master's proxy path (`/proxy/<task id>/`) and requires the per-task token the master
derives and adds to every proxied request, so nobody reaching the agent's port directly gets in
without it. Jupyter reads it from JUPYTER_TOKEN in its environment (readable by the task's own uid
only), never from its command line, which every user of the host can read in /proc. (JupyterLab
does put it in the page config it serves, i.e. in the owner's browser, through the proxy.)"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def _free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _address_towards(master_url):
    """This host's address on the route to the master (what the master can reach)."""
    parts = urllib.parse.urlsplit(master_url)
    host = parts.hostname or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, parts.port or 80))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _answers(url, token):
    req = urllib.request.Request(url, headers={"Authorization": "token " + token})
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _report(master, alloc, session_token, address):
    body = json.dumps({"proxyAddress": address}).encode()
    req = urllib.request.Request(master.rstrip("/") + "/api/v1/allocations/" + alloc + "/proxy_address",
                                 data=body, method="POST",
                                 headers={"Authorization": "Bearer " + session_token,
                                          "Content-Type": "application/json"})
    for _ in range(60):
        try:
            with urllib.request.urlopen(req, timeout=10):
                return
        except urllib.error.HTTPError as e:
            if e.code < 500 and e.code != 429:
                raise
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)


def main():
    env = os.environ
    base = env["SHIPYARD_PROXY_BASE"]
    token = env["JUPYTER_TOKEN"]
    port = _free_port()
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=0.0.0.0",
            f"--ServerApp.port={port}", "--ServerApp.port_retries=0", "--ServerApp.base_url=" + base,
            "--ServerApp.allow_origin=*", "--ServerApp.allow_root=True",
            "--ServerApp.root_dir=" + os.getcwd()]
    child = subprocess.Popen(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    status = f"http://127.0.0.1:{port}{base}api/status"
    while child.poll() is None and not _answers(status, token):
        time.sleep(0.2)
    if child.poll() is None:
        _report(env["DET_MASTER"], env["DET_ALLOCATION_ID"], env["DET_SESSION_TOKEN"],
                f"{_address_towards(env['DET_MASTER'])}:{port}")
        print("Jupyter is ready; the master proxies it at " + base, flush=True)
    sys.exit(child.wait())


if __name__ == "__main__":
    main()
