#!/bin/bash
# Shipyard: the Docker engine for an agent whose pool says `container_runtime: docker`, written by
# cloud-init (agent_bootstrap/cloud_init.py) and run once from runcmd, before the agent's boot.
#   1. start Docker (Debian's docker.io, installed by cloud-init's `packages:`) and wait until it
#      answers;
#   2. on an instance with NVIDIA GPUs (nvidia-smi lists one): install NVIDIA's container toolkit
#      when missing, from the apt sources the GPU image provides (GPU images ship NVIDIA's driver and
#      repository; a pool whose image does not can add them in its startup_script), register its
#      runtime with Docker (`nvidia-ctk runtime configure`) and restart Docker, so that a
#      container's GPU device request reaches exactly the allocation's GPUs.
# A missing toolkit is not fatal: CPU tasks still run, and GPU tasks fail with Docker's reason.
set -uo pipefail

DOCKER_PIDFILE="${SHIPYARD_DOCKER_PIDFILE:-/var/run/docker.pid}"  # overridden in tests

log() {
    local event=$1
    shift
    echo "ts=$(date -u +%Y-%m-%dT%H:%M:%SZ) component=shipyard-docker-setup event=$event $*" >&2
}

wait_for_docker() {
    local n
    for n in $(seq 1 60); do
        docker info >/dev/null 2>&1 && return 0
        sleep 1
    done
    return 1
}

has_systemd() {
    command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]
}

if has_systemd; then
    systemctl enable --now docker.service || log docker_start_failed "via=systemd"
elif ! docker info >/dev/null 2>&1; then
    # No systemd (a container host): run the engine detached.
    (nohup dockerd >>/var/log/dockerd.log 2>&1 &)
fi
if wait_for_docker; then
    log docker_ready "version=$(docker version --format '{{.Server.Version}}' 2>/dev/null)"
else
    log docker_not_ready "reason=\"docker info does not answer after 60 s\""
    exit 1
fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    if ! command -v nvidia-ctk >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q nvidia-container-toolkit >/dev/null 2>&1 ||
            log nvidia_toolkit_unavailable "reason=\"no nvidia-container-toolkit package in this image's apt sources\""
    fi
    if command -v nvidia-ctk >/dev/null 2>&1; then
        if nvidia-ctk runtime configure --runtime=docker; then
            if has_systemd; then
                systemctl restart docker.service
            elif [ -r "$DOCKER_PIDFILE" ]; then
                kill -HUP "$(cat "$DOCKER_PIDFILE")"  # dockerd reloads its runtimes on SIGHUP
            fi
            wait_for_docker && log nvidia_toolkit_ready "gpus=$(nvidia-smi -L | grep -c '^GPU')"
        else
            log nvidia_toolkit_not_configured
        fi
    fi
else
    log no_gpus "nvidia_toolkit=skipped"
fi
exit 0
