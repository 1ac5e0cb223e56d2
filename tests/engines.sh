#!/usr/bin/env bash
# Starts the container engine the tests need and builds the local base images.
#
# `make test` runs this before pytest, on a developer machine or on CI (a clean
# clone, as root, no registry reachable). It is idempotent: when a daemon
# answers and the base images exist it returns in about a second.
#
#   - no daemon answers and we are root: install Debian's docker.io if dockerd
#     is missing, start dockerd in the background (log: $DOCKERD_LOG), wait.
#   - no daemon answers and we are not root: fail with what to do.
#   - base images (no registry: made locally and `docker import`ed):
#       vllm-sm12x-test/busybox:<rev>   static busybox root (fake vLLM, fast checks)
#       vllm-sm12x-test/python:<rev>    debootstrap'd Debian bookworm + python3/pip
#
# Image names and revisions are mirrored in tests/integration/docker_env.py.
set -euo pipefail

BUSYBOX_IMAGE=${BUSYBOX_IMAGE:-vllm-sm12x-test/busybox:r1}
PYTHON_IMAGE=${PYTHON_IMAGE:-vllm-sm12x-test/python:bookworm-r1}
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/vllm-sm12x-dockerd.log}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WAIT_S=${DOCKERD_WAIT_S:-60}

log() { printf 'engines: %s\n' "$*" >&2; }
is_root() { [ "$(id -u)" = 0 ]; }

daemon_answers() {
    command -v docker >/dev/null 2>&1 || return 1
    timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

apt_install() {
    # apt-get update first: a fresh CI machine has no package lists.
    log "installing $*"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

static_busybox() {
    # The dynamic busybox would not run inside an image with no libc.
    [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 && /bin/busybox --list | grep -qx httpd
}

ensure_tools() {
    # Only what is missing, in one apt run.
    local missing=()
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    # docker.io ships the CLI too; a docker CLI already on PATH is fine.
    static_busybox || missing+=(busybox-static)
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
    # tests/unit/test_gpu_abi_check.py compiles small shared libraries and reads them with nm.
    command -v gcc >/dev/null 2>&1 || missing+=(gcc)
    command -v nm >/dev/null 2>&1 || missing+=(binutils)
    if [ ${#missing[@]} -gt 0 ]; then
        is_root || { log "missing ${missing[*]} and not root: install them (apt-get install ${missing[*]})"; exit 1; }
        apt_install "${missing[@]}"
    fi
}

start_dockerd() {
    local pidfile=/var/run/docker.pid
    # A dockerd that died leaves its pid file behind and the next one refuses to start.
    if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        rm -f "$pidfile"
    fi
    log "starting dockerd (log: $DOCKERD_LOG)"
    # 9>&-: the daemon outlives this script and must not inherit the lock (take_lock), or
    # every later `make test` on this machine waits on it forever.
    nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null 9>&- &
    local waited=0
    until daemon_answers; do
        if ! kill -0 $! 2>/dev/null; then
            log "dockerd exited; last lines of $DOCKERD_LOG:"
            tail -n 20 "$DOCKERD_LOG" >&2
            exit 1
        fi
        if [ "$waited" -ge "$WAIT_S" ]; then
            log "dockerd did not answer within ${WAIT_S}s; last lines of $DOCKERD_LOG:"
            tail -n 20 "$DOCKERD_LOG" >&2
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    log "dockerd answers after ${waited}s"
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

build_busybox_image() {
    have_image "$BUSYBOX_IMAGE" && return 0
    local root
    root=$(mktemp -d)
    mkdir -p "$root/bin" "$root/tmp" "$root/etc" "$root/www"
    cp /bin/busybox "$root/bin/busybox"
    local applet
    for applet in $(/bin/busybox --list); do
        [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    chmod 1777 "$root/tmp"
    tar -C "$root" -c . | docker import -c 'ENV PATH=/bin' -c 'CMD ["/bin/sh"]' - "$BUSYBOX_IMAGE" >/dev/null
    rm -rf "$root"
    log "built $BUSYBOX_IMAGE"
}

build_python_image() {
    have_image "$PYTHON_IMAGE" && return 0
    local root started=$SECONDS
    root=$(mktemp -d)
    # minbase + python3/pip: what an image with vLLM needs to install the
    # launcher and run `launcher patch`; no CUDA (this base never runs vLLM).
    debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
        bookworm "$root" "$DEBIAN_MIRROR" >"$root.log" 2>&1 || {
        log "debootstrap failed; last lines:"; tail -n 20 "$root.log" >&2; rm -rf "$root" "$root.log"; exit 1; }
    rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"* "$root.log"
    tar -C "$root" -c . | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' - "$PYTHON_IMAGE" >/dev/null
    rm -rf "$root"
    log "built $PYTHON_IMAGE in $((SECONDS - started))s"
}

# Two `make test` runs started together on one machine: one at a time starts
# dockerd and builds the base images; the other waits, then finds them.
take_lock() {
    local lock=${ENGINES_LOCK:-${TMPDIR:-/tmp}/vllm-sm12x-engines.lock}
    command -v flock >/dev/null 2>&1 || { log "no flock: not serialized with other test runs"; return 0; }
    if ! { exec 9>>"$lock"; } 2>/dev/null; then
        log "cannot open $lock: not serialized with other test runs"
        return 0
    fi
    chmod a+rw "$lock" 2>/dev/null || true
    flock 9
}

main() {
    local started=$SECONDS
    take_lock
    if ! daemon_answers; then
        is_root || {
            log "no Docker daemon answers and this is not root: start one (sudo systemctl start docker)"
            log "or run as root so this script can install and start it"
            exit 1
        }
        ensure_tools
        start_dockerd
    fi
    if ! have_image "$BUSYBOX_IMAGE" || ! have_image "$PYTHON_IMAGE"; then
        ensure_tools
        build_busybox_image
        build_python_image
    fi
    log "ready in $((SECONDS - started))s"
}

main "$@"
