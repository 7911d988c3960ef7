#!/bin/bash
# Shipyard master boot, written by cloud-init (infra/render.py) and run once from runcmd:
#   1. det-master: already on the machine (an image with Shipyard), else pip-installed into
#      /opt/shipyard-master from @@PACKAGE_COMMENT@@;
#   2. the state directory (0700) and the systemd unit shipyard-master.service, whose ExecStart is
#      /usr/local/bin/shipyard-master-start: it reads the passwords from the secret store at every
#      start and runs det-master with them in its environment (never on disk, never in user-data).
#
# Sandbox overrides, so that the script runs unchanged in tests (tests/e2e/test_deploy_boot.py):
#   SHIPYARD_ROOT    prefix of every absolute path the script touches (default: none); when set,
#                    the unit is written but not started (the sandbox runs ExecStart)
#   SHIPYARD_PYTHON  interpreter when det-master has none beside it (default python3)
set -euo pipefail

PACKAGE=@@PACKAGE@@

ROOT="${SHIPYARD_ROOT:-}"
ROOT="${ROOT%/}"
VENV="$ROOT/opt/shipyard-master"
CONFIG="$ROOT/etc/shipyard/master.yaml"
START="$ROOT/usr/local/bin/shipyard-master-start"
STATE_DIR="$ROOT/var/lib/shipyard"
UNIT_FILE="$ROOT/etc/systemd/system/shipyard-master.service"

log() {
    local event=$1
    shift
    echo "ts=$(date -u +%Y-%m-%dT%H:%M:%SZ) component=shipyard-master-boot event=$event $*" >&2
}

fail() {
    log boot_failed "reason=\"$*\""
    exit 1
}

retry() {
    local attempts=$1 n=1
    shift
    until "$@"; do
        [ "$n" -ge "$attempts" ] && return 1
        sleep $((n < 4 ? 1 << (n - 1) : 5))
        n=$((n + 1))
    done
}

main() {
    case "$ROOT" in
    *[[:space:]]*) fail "SHIPYARD_ROOT must not contain spaces" ;;
    esac
    log boot_started
    [ -r "$CONFIG" ] || fail "no master config at $CONFIG"

    local det_master
    if [ -x "$VENV/bin/det-master" ]; then
        det_master="$VENV/bin/det-master"
    elif det_master=$(command -v det-master); then
        log install_skipped "reason=\"det-master found at $det_master\""
    else
        log installing "package=\"$PACKAGE\""
        python3 -m venv "$VENV" || fail "cannot create $VENV"
        retry 5 "$VENV/bin/pip" install --quiet --disable-pip-version-check "$PACKAGE" ||
            fail "cannot install $PACKAGE"
        det_master="$VENV/bin/det-master"
    fi
    [ -x "$det_master" ] || fail "no det-master after the install"
    local python
    python="$(dirname "$det_master")/python"
    [ -x "$python" ] || python=$(command -v "${SHIPYARD_PYTHON:-python3}") || fail "no Python interpreter"
    log master_installed "det_master=$det_master python=$python"

    mkdir -p "$STATE_DIR" "$(dirname "$UNIT_FILE")"
    chmod 0700 "$STATE_DIR"
    cat >"$UNIT_FILE.tmp" <<UNIT
[Unit]
Description=Shipyard master
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
Environment=PYTHONUNBUFFERED=1
ExecStart=$python $START --det-master $det_master --config $CONFIG --state-dir $STATE_DIR
# The database or the secret store may not answer yet right after the stack is created.
Restart=always
RestartSec=5
KillMode=mixed
TimeoutStopSec=30

[Install]
WantedBy=multi-user.target
UNIT
    mv "$UNIT_FILE.tmp" "$UNIT_FILE"
    log unit_written "path=$UNIT_FILE"

    if [ -n "$ROOT" ]; then
        log master_not_started "reason=\"SHIPYARD_ROOT is set: the sandbox runs ExecStart\""
    elif command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl daemon-reload
        systemctl enable shipyard-master.service
        systemctl restart shipyard-master.service
        log master_started "via=systemd"
    else
        nohup setsid "$python" "$START" --det-master "$det_master" --config "$CONFIG" \
            --state-dir "$STATE_DIR" >>/var/log/shipyard-master.log 2>&1 &
        log master_started "via=nohup pid=$!"
    fi
}

main "$@"
