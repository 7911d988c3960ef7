#!/bin/bash
# Shipyard agent boot, written by cloud-init (agent_bootstrap/cloud_init.py) and run once per
# instance from runcmd. It turns this host into an agent of pool @@POOL_COMMENT@@:
#   1. run the pool's startup script (/etc/shipyard/startup-script), if there is one;
#   2. read this instance's id from the cloud's metadata service;
#   3. fetch the agent's code from the master (GET /api/v1/agent/package, bootstrap token) into
#      /opt/shipyard;
#   4. check the Python dependencies of the agent and of its trials (Python 3.9+; the storage client
#      of this cloud's bucket, @@STORAGE_MODULE@@, which trials checkpoint with; a venv on top of the
#      system packages, with the exact versions of the package's constraints file, if the
#      distribution's are missing or too old);
#   5. write and start the systemd unit shipyard-agent.service (--instance-id/--agent-id from 2).
# The credential stays in /etc/shipyard/agent-token (0600): it is never put on a command line.
#
# Sandbox overrides, so that the script runs unchanged in tests:
#   SHIPYARD_ROOT          prefix of every absolute path the script touches (default: none); when
#                          set, the unit is written but not started (the sandbox runs ExecStart)
#   SHIPYARD_METADATA_URL  metadata service (default @@DEFAULT_METADATA_URL@@)
#   SHIPYARD_PYTHON        interpreter for the agent (default python3)
set -euo pipefail

PROVIDER=@@PROVIDER@@
MASTER_URL=@@MASTER_URL@@
POOL=@@POOL@@
LAUNCH_ID=@@LAUNCH_ID@@
WORK_DIR_PATH=@@WORK_DIR@@
PIP_PINS=(@@PIP_PINS@@)
# In the agent's package: exact pins of the agent's libraries and their dependencies.
CONSTRAINTS_PATH=@@CONSTRAINTS_PATH@@

ROOT="${SHIPYARD_ROOT:-}"
ROOT="${ROOT%/}"
METADATA_URL="${SHIPYARD_METADATA_URL:-@@DEFAULT_METADATA_URL@@}"
METADATA_URL="${METADATA_URL%/}"
PY="${SHIPYARD_PYTHON:-python3}"

CONF_DIR="$ROOT/etc/shipyard"
CONFIG_FILE="$CONF_DIR/agent.yaml"
TOKEN_FILE="$CONF_DIR/agent-token"
STARTUP_SCRIPT="$CONF_DIR/startup-script"
INSTALL_DIR="$ROOT/opt/shipyard"
VENV_DIR="$ROOT/opt/shipyard-venv"
WORK_DIR="$ROOT$WORK_DIR_PATH"
UNIT_FILE="$ROOT/etc/systemd/system/shipyard-agent.service"

# Bounded retries: metadata and the master may take a moment to answer after boot, and a master
# that is being restarted comes back within minutes. About 7 minutes in all.
RETRY_ATTEMPTS=85

log() {
    local event=$1
    shift
    echo "ts=$(date -u +%Y-%m-%dT%H:%M:%SZ) component=shipyard-agent-boot event=$event launch_id=$LAUNCH_ID $*" >&2
}

fail() {
    log boot_failed "reason=\"$*\""
    exit 1
}

# retry ATTEMPTS CMD...: run CMD until it succeeds, at most ATTEMPTS times, pausing 1, 2, 4, then
# 5 seconds (plus up to 0.9 s of jitter) between attempts.
retry() {
    local attempts=$1 n=1 delay
    shift
    until "$@"; do
        if [ "$n" -ge "$attempts" ]; then
            return 1
        fi
        delay=$((n < 4 ? 1 << (n - 1) : 5))
        sleep "$delay.$((RANDOM % 10))"
        n=$((n + 1))
    done
}

# http_request METHOD URL OUT [--no-proxy] [--bearer-file FILE] ["Header: value"]...
# One HTTP request with Python's standard library (python3 is installed by cloud-init, curl is
# not promised). The body goes to OUT ("-": stdout); any error or non-2xx status fails.
http_request() {
    "$PY" -c '
import sys, urllib.request
method, url, out = sys.argv[1:4]
headers, handlers, args = {}, [], sys.argv[4:]
i = 0
while i < len(args):
    if args[i] == "--no-proxy":
        handlers.append(urllib.request.ProxyHandler({}))
    elif args[i] == "--bearer-file":
        i += 1
        with open(args[i], encoding="utf-8") as f:
            headers["Authorization"] = "Bearer " + f.read().strip()
    else:
        key, _, value = args[i].partition(":")
        headers[key.strip()] = value.strip()
    i += 1
req = urllib.request.Request(url, method=method, headers=headers, data=b"" if method == "PUT" else None)
try:
    with urllib.request.build_opener(*handlers).open(req, timeout=15) as resp:
        body = resp.read()
except Exception as e:
    sys.stderr.write("%s %s: %s\n" % (method, url, e))
    sys.exit(1)
if out == "-":
    sys.stdout.write(body.decode("utf-8"))
else:
    with open(out, "wb") as f:
        f.write(body)
' "$@"
}

metadata_instance_id() {
    case "$PROVIDER" in
    aws)
        # IMDSv2 only (the provider launches with HttpTokens=required): a session token first.
        local token
        token=$(http_request PUT "$METADATA_URL/latest/api/token" - --no-proxy \
            "X-aws-ec2-metadata-token-ttl-seconds: 300") || return 1
        http_request GET "$METADATA_URL/latest/meta-data/instance-id" - --no-proxy \
            "X-aws-ec2-metadata-token: $token"
        ;;
    gcp)
        http_request GET "$METADATA_URL/computeMetadata/v1/instance/name" - --no-proxy \
            "Metadata-Flavor: Google"
        ;;
    *)
        return 1
        ;;
    esac
}

python_supported() {
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' 2>/dev/null
}

python_deps_ok() {
    "$1" -c 'import httpx, yaml, tenacity, pydantic; assert int(pydantic.VERSION.split(".")[0]) >= 2' 2>/dev/null &&
        "$1" -c 'import @@STORAGE_MODULE@@' 2>/dev/null
}

fetch_agent_package() {
    local tmp
    tmp=$(mktemp -d "$ROOT/opt/.shipyard-agent.XXXXXX")
    if ! retry "$RETRY_ATTEMPTS" http_request GET "$MASTER_URL/api/v1/agent/package" "$tmp/agent.tar.gz" \
        --bearer-file "$TOKEN_FILE"; then
        rm -rf "$tmp"
        return 1
    fi
    if ! mkdir "$tmp/src" || ! tar -xzf "$tmp/agent.tar.gz" -C "$tmp/src" --no-same-owner; then
        rm -rf "$tmp"
        return 1
    fi
    rm -rf "$INSTALL_DIR.old"
    if [ -e "$INSTALL_DIR" ]; then
        mv "$INSTALL_DIR" "$INSTALL_DIR.old"
    fi
    mv "$tmp/src" "$INSTALL_DIR"
    rm -rf "$tmp" "$INSTALL_DIR.old"
}

main() {
    case "$ROOT" in
    *[[:space:]]*) fail "SHIPYARD_ROOT must not contain spaces" ;;
    esac
    log boot_started "provider=$PROVIDER pool=$POOL master=$MASTER_URL"
    [ -r "$TOKEN_FILE" ] || fail "no credential at $TOKEN_FILE"
    [ -r "$CONFIG_FILE" ] || fail "no agent config at $CONFIG_FILE"

    if [ -e "$STARTUP_SCRIPT" ]; then
        log startup_script_running "path=$STARTUP_SCRIPT"
        if ! "$STARTUP_SCRIPT"; then
            fail "the pool's startup script failed"
        fi
        log startup_script_done
    fi

    local instance_id
    if ! instance_id=$(retry "$RETRY_ATTEMPTS" metadata_instance_id); then
        fail "cannot read the instance id from $METADATA_URL"
    fi
    if ! [[ "$instance_id" =~ ^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$ ]]; then
        fail "unexpected instance id from the metadata service"
    fi
    log instance_identified "instance_id=$instance_id"

    local python
    python=$(command -v "$PY") || fail "no Python interpreter $PY"
    python_supported "$python" ||
        fail "$python is Python $("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])'); the agent needs 3.9 or newer"

    mkdir -p "$ROOT/opt" "$WORK_DIR" "$(dirname "$UNIT_FILE")"
    chmod 0700 "$WORK_DIR"
    fetch_agent_package || fail "cannot fetch the agent from $MASTER_URL"

    if ! python_deps_ok "$python"; then
        # Older distributions ship pydantic 1 (the agent needs 2) or lack a module (the bucket's
        # storage client is not among the packages cloud-init installs): add them in a venv that
        # still sees the system packages, at the versions of the package's constraints. Trials run
        # from it as their own users: world-readable, whatever the boot's umask.
        log python_deps_missing "action=venv pins=\"${PIP_PINS[*]}\""
        mkdir -p "$(dirname "$VENV_DIR")"
        (umask 022 && "$python" -m venv --system-site-packages "$VENV_DIR") || fail "cannot create $VENV_DIR"
        (umask 022 && retry 5 "$VENV_DIR/bin/python" -m pip install --quiet --disable-pip-version-check \
            -c "$INSTALL_DIR/$CONSTRAINTS_PATH" "${PIP_PINS[@]}") ||
            fail "cannot install the agent's Python dependencies"
        python="$VENV_DIR/bin/python"
        python_deps_ok "$python" || fail "the agent's Python dependencies are still missing"
    fi
    PYTHONPATH="$INSTALL_DIR" "$python" -m agent_bootstrap.agent --help >/dev/null ||
        fail "the agent fetched from the master does not run"
    log agent_installed "path=$INSTALL_DIR python=$python"

    cat >"$UNIT_FILE.tmp" <<UNIT
[Unit]
Description=Shipyard agent (pool $POOL)
Wants=network-online.target
# docker.service: ordering only (agents running processes have no engine); see shipyard-docker-setup.
After=network-online.target docker.service

[Service]
Type=simple
Environment=PYTHONPATH=$INSTALL_DIR
Environment=PYTHONUNBUFFERED=1
ExecStart=$python -m agent_bootstrap.agent --config $CONFIG_FILE --token-file $TOKEN_FILE --work-dir $WORK_DIR --instance-id $instance_id --agent-id $instance_id
# 2: bad configuration, 3: refused by the master, 4: master lost for good (the instance is
# being powered off by on_connection_lost): restarting cannot help with any of them.
Restart=on-failure
RestartSec=5
RestartPreventExitStatus=2 3 4
# SIGTERM to the agent only: it stops its tasks within their grace period itself.
KillMode=mixed
TimeoutStopSec=90

[Install]
WantedBy=multi-user.target
UNIT
    mv "$UNIT_FILE.tmp" "$UNIT_FILE"
    log unit_written "path=$UNIT_FILE"

    if [ -n "$ROOT" ]; then
        log agent_not_started "reason=\"SHIPYARD_ROOT is set: the sandbox runs ExecStart\""
    elif command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl daemon-reload
        systemctl enable shipyard-agent.service
        systemctl restart shipyard-agent.service
        log agent_started "via=systemd"
    else
        # No systemd (containers): run it detached, without the supervision.
        PYTHONPATH="$INSTALL_DIR" PYTHONUNBUFFERED=1 nohup setsid "$python" -m agent_bootstrap.agent \
            --config "$CONFIG_FILE" --token-file "$TOKEN_FILE" --work-dir "$WORK_DIR" \
            --instance-id "$instance_id" --agent-id "$instance_id" >>/var/log/shipyard-agent.log 2>&1 &
        log agent_started "via=nohup pid=$!"
    fi
}

main "$@"
