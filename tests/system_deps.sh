#!/usr/bin/env bash
# What the test suite needs from Debian: cloud-init (validates the user-data schema), openssh-server
# (the real-SSH bootstrap test), PostgreSQL's server binaries (the throwaway PostgreSQL) and Chromium
# with its driver (the web UI's browser tests in tests/ui/, driven by playwright), docker.io
# (dockerd, containerd, runc, tini: tests/docker/ starts its own engine) and debootstrap (the clean
# cloud-like image of the strict boot, tests/e2e/cloud_image.py).
# Installs what is missing when it can (root with apt-get). With CI=true anything still missing is
# an error; elsewhere the tests that need it skip and say why.
set -uo pipefail

missing=()
command -v cloud-init >/dev/null 2>&1 || missing+=(cloud-init)
{ command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; } || missing+=(openssh-server)
{ ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; } || missing+=(postgresql)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
{ command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ]; } || missing+=(docker.io)
{ command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ]; } || missing+=(debootstrap)

[ ${#missing[@]} -eq 0 ] && exit 0
echo "test set-up: installing ${missing[*]}" >&2
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >/dev/null 2>&1
fi

still=()
command -v cloud-init >/dev/null 2>&1 || still+=(cloud-init)
{ command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; } || still+=(openssh-server)
{ ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; } || still+=(postgresql)
[ -x /usr/bin/chromium ] || still+=(chromium)
[ -x /usr/bin/chromedriver ] || still+=(chromium-driver)
{ command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ]; } || still+=(docker.io)
{ command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ]; } || still+=(debootstrap)
[ ${#still[@]} -eq 0 ] && exit 0
if [ "${CI:-}" = "true" ]; then
    echo "test set-up: could not install ${still[*]} (CI=true: the tests that need them cannot run)" >&2
    exit 1
fi
echo "warning: ${still[*]} not installed; the tests that need them will skip" >&2
exit 0
