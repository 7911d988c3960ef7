#!/bin/bash
# Shipyard master boot, written by cloud-init (infra/render.py) and run once from runcmd; the unit it
# writes runs it again with --install-only before every start of the master (ExecStartPre):
#   1. det-master into the virtualenv /opt/shipyard-master: by default the release `det deploy`
#      shipped to the cluster's bucket (infra/release.py: `current` names a wheel and its
#      constraints; the wheel is installed with `pip install WHEEL -c constraints.txt`), reinstalled
#      whenever `current` names another version (`det deploy ... upgrade`); a release missing from
#      the bucket is a failed boot, never something else installed. With --shipyard-package, that
#      pip requirement instead (@@PACKAGE_COMMENT@@), from the index pip is configured with;
#   2. the state directory (0700) and the systemd unit shipyard-master.service, whose ExecStart is
#      /usr/local/bin/shipyard-master-start: it reads the passwords from the secret store at every
#      start and runs det-master with them in its environment (never on disk, never in user-data).
#
# Sandbox overrides, so that the script runs unchanged in tests (tests/e2e/test_deploy_boot.py):
#   SHIPYARD_ROOT    prefix of every absolute path the script touches (default: none); when set,
#                    the unit is written but not started (the sandbox runs ExecStart)
#   SHIPYARD_PYTHON  interpreter that creates the virtualenv (default python3)
#   SHIPYARD_RELEASE_WAIT_S  how long the first boot waits for the release to appear in the bucket
#                    (default 1200: `det deploy up` uploads it once the stack exists)
set -euo pipefail

PACKAGE=@@PACKAGE@@
PROVIDER=@@PROVIDER@@
BOTO3=@@BOTO3@@

ROOT="${SHIPYARD_ROOT:-}"
ROOT="${ROOT%/}"
VENV="$ROOT/opt/shipyard-master"
CONFIG="$ROOT/etc/shipyard/master.yaml"
START="$ROOT/usr/local/bin/shipyard-master-start"
FETCH="$ROOT/usr/local/bin/shipyard-master-fetch"
SELF="$ROOT/usr/local/bin/shipyard-master-boot"
RELEASE_DIR="$ROOT/var/lib/shipyard-release"
RELEASE_WAIT_S="${SHIPYARD_RELEASE_WAIT_S:-1200}"
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

pip_install() {
    retry 5 "$VENV/bin/pip" install --quiet --disable-pip-version-check "$@"
}

make_venv() {
    [ -x "$VENV/bin/pip" ] && return 0
    "${SHIPYARD_PYTHON:-python3}" -m venv "$VENV" || fail "cannot create $VENV"
}

fetch() {
    local key=$1 dest=$2 wait=${3:-0} rc=0
    "$VENV/bin/python" "$FETCH" "$key" "$dest" --wait-s "$wait" || rc=$?
    case $rc in
    0) return 0 ;;
    3) fail "the release object $key is missing from the cluster's bucket (det deploy ... upgrade ships it)" ;;
    *) fail "cannot read $key from the cluster's bucket" ;;
    esac
}

# The release `current` names, installed unless it already is.
install_release() {
    make_venv
    if [ "$PROVIDER" = aws ]; then
        pip_install "boto3==$BOTO3" || fail "cannot install boto3==$BOTO3 (to read the bucket)"
    fi
    mkdir -p "$RELEASE_DIR"
    chmod 0700 "$RELEASE_DIR"
    local wait=0
    [ -x "$VENV/bin/det-master" ] || wait=$RELEASE_WAIT_S
    fetch "shipyard/releases/current" "$RELEASE_DIR/current" "$wait"
    local version wheel
    version=$(sed -n 1p "$RELEASE_DIR/current")
    wheel=$(sed -n 2p "$RELEASE_DIR/current")
    [[ "$version" =~ ^[0-9][0-9A-Za-z.+!_-]{0,63}$ ]] || fail "the bucket's release pointer names no version"
    [[ "$wheel" =~ ^shipyard-[0-9][0-9A-Za-z.+!_]{0,63}-py3-none-any\.whl$ ]] ||
        fail "the bucket's release pointer names no wheel"
    if [ -x "$VENV/bin/det-master" ] && [ "$(cat "$VENV/.shipyard-release" 2>/dev/null)" = "$version" ]; then
        log release_current "version=$version"
        return 0
    fi
    log installing "version=$version wheel=$wheel"
    mkdir -p "$RELEASE_DIR/$version"
    fetch "shipyard/releases/$version/$wheel" "$RELEASE_DIR/$version/$wheel"
    fetch "shipyard/releases/$version/constraints.txt" "$RELEASE_DIR/$version/constraints.txt"
    pip_install "$RELEASE_DIR/$version/$wheel" -c "$RELEASE_DIR/$version/constraints.txt" ||
        fail "cannot install $wheel"
    echo "$version" >"$VENV/.shipyard-release"
    log release_installed "version=$version"
}

install() {
    if [ -n "$PACKAGE" ]; then
        [ -x "$VENV/bin/det-master" ] && return 0
        log installing "package=\"$PACKAGE\""
        make_venv
        pip_install "$PACKAGE" || fail "cannot install $PACKAGE"
    else
        install_release
    fi
    [ -x "$VENV/bin/det-master" ] || fail "no det-master after the install"
}

main() {
    case "$ROOT" in
    *[[:space:]]*) fail "SHIPYARD_ROOT must not contain spaces" ;;
    esac
    if [ "${1:-}" = --install-only ]; then
        install
        return 0
    fi
    log boot_started
    [ -r "$CONFIG" ] || fail "no master config at $CONFIG"
    install
    local det_master="$VENV/bin/det-master" python="$VENV/bin/python"
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
# The release `current` names, installed before every start (det deploy ... upgrade moves it).
ExecStartPre=$SELF --install-only
TimeoutStartSec=1800
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
