# Helpers shared by the peer broker scripts (sourced, not run).
# shellcheck shell=bash

SCRIPT_NAME=$(basename "$0")
PEERS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$PEERS_DIR/../.." && pwd)
PROBE="$PEERS_DIR/stomp_probe.py"

# The probe's `connect` mode is stdlib only; `roundtrip` needs stomp.py (in the project venv).
if [[ -z "${PEER_PYTHON:-}" ]]; then
    if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
        PEER_PYTHON="$REPO_ROOT/.venv/bin/python"
    else
        PEER_PYTHON=python3
    fi
fi

log() { printf '[%s] %s\n' "$SCRIPT_NAME" "$*" >&2; }
die() {
    printf '[%s] error: %s\n' "$SCRIPT_NAME" "$*" >&2
    exit 1
}

need_root() {
    [[ $(id -u) -eq 0 ]] || die "$1 needs root (apt-get); run it as root"
}

pkg_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# apt-get install, running `apt-get update` first only when the package is unknown to apt.
# Debian's maintainer scripts start a package's service on install unless policy-rc.d forbids it;
# if no policy-rc.d exists, a temporary one (exit 101: "action forbidden") is put in place for
# the duration of the install, so no system broker (nor a global epmd) is started at all.
apt_install() {
    local pkg=$1 policy=/usr/sbin/policy-rc.d made_policy='' rc=0
    need_root "installing $pkg"
    if ! apt-cache show "$pkg" >/dev/null 2>&1; then
        log "package $pkg unknown to apt; running apt-get update"
        apt-get update -q || die "apt-get update failed"
    fi
    if [[ ! -e "$policy" ]]; then
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
        printf '#!/bin/sh\n# temporary (benchmarks/peers): no service starts during install\n' \
            >"$policy"
        echo 'exit 101' >>"$policy"
        chmod 755 "$policy"
        made_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$pkg" || rc=$?
    if [[ -n "$made_policy" ]]; then
        rm -f "$policy"
        trap - EXIT
    fi
    ((rc == 0)) || die "apt-get install $pkg failed (exit $rc)"
}

# Absolute path of a (possibly not yet existing) directory.
abs_dir() {
    [[ -n "$1" ]] || die "DATA_DIR must not be empty"
    realpath -m -- "$1"
}

check_port() {
    local port=$1
    if ! [[ "$port" =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
        die "bad port: '$port'"
    fi
}

# True when something already listens on 127.0.0.1:PORT (or on the wildcard address).
port_in_use() {
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
}

pid_alive() {
    [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null && [[ "$(ps -o stat= -p "$1" 2>/dev/null)" != Z* ]]
}

# The process's command line with NULs turned into spaces.
pid_cmdline() {
    tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" || true
}

# Wait for PID to exit; returns 1 if it is still alive after SECONDS.
wait_exit() {
    local pid=$1 seconds=$2 i
    for ((i = 0; i < seconds * 10; i++)); do
        pid_alive "$pid" || return 0
        sleep 0.1
    done
    ! pid_alive "$pid"
}

# TERM, wait up to GRACE seconds, then KILL and wait again.
terminate_pid() {
    local pid=$1 grace=$2
    pid_alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_exit "$pid" "$grace"; then
        log "pid $pid still alive after ${grace}s; sending KILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_exit "$pid" 10 || die "pid $pid survived KILL"
    fi
}

# wait_stomp PORT TIMEOUT [VHOST]: succeed once a STOMP CONNECT gets CONNECTED.
wait_stomp() {
    "$PEER_PYTHON" "$PROBE" connect --port "$1" --timeout "$2" ${3:+--vhost "$3"}
}

# The distribution's own service of a peer (not one of ours) must not run beside the benchmarks:
# it would share the machine's CPUs and disk with the broker being measured.
# Usage: check_system_service NAME PIDFILE...
# A live process named by one of the pid files (or, under systemd, an active unit) makes this
# refuse, saying what runs and how to go on, unless STOP_SYSTEM_SERVICE=1 (`install
# --stop-system-service`): then the service is asked to stop (init script or systemctl), a process
# of the pid files that survives gets TERM by its pid only, and the service is disabled at boot.
# Nothing is signalled that a pid file of the service does not name.
check_system_service() {
    local name=$1 pidfile pid systemd='' running=()
    shift
    command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]] && systemd=1
    for pidfile in "$@"; do
        [[ -f "$pidfile" ]] || continue
        pid=$(cat "$pidfile" 2>/dev/null || true)
        pid_alive "$pid" && running+=("$pid")
    done
    if [[ -n "$systemd" ]] && systemctl is-active --quiet "$name" 2>/dev/null; then
        running+=("unit")
    fi
    ((${#running[@]})) || return 0
    if [[ "${STOP_SYSTEM_SERVICE:-0}" != 1 ]]; then
        die "the system $name service is running (${running[*]}; pid files: $*). The benchmarks" \
            "need the machine to themselves and this script stops only what it started: stop" \
            "that service yourself, or run '$SCRIPT_NAME install --stop-system-service' to have" \
            "it stopped and disabled at boot"
    fi
    log "stopping the system $name service (--stop-system-service)"
    if [[ -n "$systemd" ]]; then
        systemctl stop "$name" >/dev/null 2>&1 || true
    else
        service "$name" stop >/dev/null 2>&1 || true
    fi
    for pid in "${running[@]}"; do
        [[ "$pid" == unit ]] || terminate_pid "$pid" 30
    done
    disable_system_service "$name"
}

# Keep the distribution's service NAME off at boot (both work without a running systemd). Only
# for a package this script installed itself, or with --stop-system-service.
disable_system_service() {
    local name=$1
    if command -v systemctl >/dev/null 2>&1; then
        systemctl disable "$name" >/dev/null 2>&1 || true
    fi
    if [[ -x "/etc/init.d/$name" ]]; then
        update-rc.d "$name" disable >/dev/null 2>&1 || true
    fi
}

# Options of `install`: --stop-system-service (see check_system_service).
parse_install_options() {
    local arg
    for arg in "$@"; do
        case "$arg" in
        --stop-system-service) STOP_SYSTEM_SERVICE=1 ;;
        *) die "install: unknown option '$arg' (known: --stop-system-service)" ;;
        esac
    done
}

# A TCP port on 127.0.0.1 that nothing listens on right now.
free_port() {
    "$PEER_PYTHON" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}
