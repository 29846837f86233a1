#!/usr/bin/env bash
# Smoke test of the peer scripts: for each peer (default: activemq rabbitmq), install, start it
# in a temporary DATA_DIR on a free port, send one persistent message (RECEIPT awaited) and
# receive it back with stomp.py, restart and check that a persistent message sent before the
# restart is still there, stop, and check that no process of it is left. Prints timings.
#
#   smoke.sh [activemq|rabbitmq]...
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Live processes whose command line or environment mentions DIR: the brokers, their children
# and RabbitMQ's epmd all do (java through its -D arguments, the Erlang processes through the
# RABBITMQ_* and HOME variables they inherit). This script's own processes are skipped.
leftovers() {
    local dir=$1 pid
    for pid in $(ps -eo pid=); do
        [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
        if { [[ "$(pid_cmdline "$pid")" == *"$dir"* ]] ||
            tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qF "$dir"; } &&
            pid_alive "$pid"; then
            echo "$pid $(pid_cmdline "$pid" | cut -c1-120)"
        fi
    done
}

smoke_one() {
    local peer=$1 script="$PEERS_DIR/$1.sh" dir port t queue
    dir=$(mktemp -d "${TMPDIR:-/tmp}/sluice-peer-$peer.XXXXXX")
    port=$(free_port)
    # shellcheck disable=SC2064
    trap "'$script' stop '$dir' >/dev/null 2>&1 || true" EXIT

    t=$(now)
    "$script" install
    echo "$peer: install took $(elapsed "$t") s"

    t=$(now)
    "$script" start "$dir" "$port"
    echo "$peer: start took $(elapsed "$t") s (port $port, dir $dir)"
    "$script" status "$dir"

    "$PEER_PYTHON" "$PROBE" roundtrip --port "$port"
    queue="/queue/smoke-restart-$RANDOM"
    "$PEER_PYTHON" "$PROBE" send --port "$port" --queue "$queue"

    t=$(now)
    "$script" stop "$dir"
    echo "$peer: stop took $(elapsed "$t") s"
    "$script" start "$dir" "$port"
    "$PEER_PYTHON" "$PROBE" receive --port "$port" --queue "$queue" --timeout 15
    "$script" stop "$dir"
    trap - EXIT

    if "$script" status "$dir" >/dev/null; then
        die "$peer: status still says running after stop"
    fi
    local left
    left=$(leftovers "$dir")
    [[ -z "$left" ]] || die "$peer: processes left after stop:"$'\n'"$left"
    echo "$peer: no process left"
    rm -rf "$dir"
    echo "$peer: OK"
}

peers=("$@")
[[ ${#peers[@]} -gt 0 ]] || peers=(activemq rabbitmq)
for peer in "${peers[@]}"; do
    [[ -x "$PEERS_DIR/$peer.sh" ]] || die "unknown peer: $peer"
    smoke_one "$peer"
done
