#!/usr/bin/env bash
# The Spark pipeline example in one command, on a fresh machine (Python 3.11+ and Java 17+):
#
#   examples/spark_pipeline/run.sh [EVENTS]
#
# Installs Sluice with its spark extra into .venv, starts a broker (journal store, free port),
# publishes EVENTS sensor events (default 5000), runs the streaming job until it has read them
# all (availableNow), checks that every event is counted in exactly one window written to
# Parquet (the job exits with 1 if not), prints a few windows from the results queue, and stops
# everything. Work files stay in a temporary directory, printed at the end.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${VENV:-$root/.venv}
events=${1:-5000}

if ! java -version >/dev/null 2>&1; then
    echo "Spark needs Java 17 or newer on PATH (Debian: apt-get install openjdk-17-jre-headless)" >&2
    exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
echo "installing sluice[spark] into $venv (the first time downloads pyspark, about a minute)"
"$venv/bin/python" -m pip install --quiet -e "$root[spark]"

work=$(mktemp -d -t sluice-pipeline-XXXXXX)
broker_pid=""
cleanup() {
    if [ -n "$broker_pid" ]; then
        kill "$broker_pid" 2>/dev/null || true
        wait "$broker_pid" 2>/dev/null || true
    fi
}
trap cleanup EXIT

"$venv/bin/python" -m sluice broker --config "$here/broker.toml" --data "$work/data" \
    --stomp 127.0.0.1:0 >"$work/broker.out" 2>"$work/broker.log" &
broker_pid=$!
port=""
for _ in $(seq 1 100); do
    port=$(sed -n 's/.*listening on [0-9.]*:\([0-9]*\).*/\1/p' "$work/broker.out" "$work/broker.log" | head -n 1)
    [ -n "$port" ] && break
    kill -0 "$broker_pid" 2>/dev/null || { cat "$work/broker.log" >&2; exit 1; }
    sleep 0.1
done
[ -n "$port" ] || { echo "the broker did not start" >&2; cat "$work/broker.log" >&2; exit 1; }
broker="127.0.0.1:$port"
echo "broker on $broker, data in $work/data"

export SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$venv/bin/python"
"$venv/bin/python" "$here/producer.py" --broker "$broker" --events "$events"
"$venv/bin/python" "$here/job.py" --broker "$broker" --work "$work" --master "local[2]" \
    --available-now --check

echo "first results on /queue/pipeline.windows:"
"$venv/bin/sluice" recv /queue/pipeline.windows --broker "$broker" -n 3 --timeout 5
echo "work directory: $work"
