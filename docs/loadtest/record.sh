#!/usr/bin/env bash
# Record the capacity load tests of docs/loadtest/RESULTS.md on a quiet host (issue 16, "Must show").
#
#   sudo env PYTHON=.venv/bin/python docs/loadtest/record.sh          # as root, any cwd; ~10-15 min
#   sudo env PYTHON=.venv/bin/python SMOKE=1 docs/loadtest/record.sh  # end-to-end check: 2 s steps, ~1-2 min,
#                                                                     # writes to build/loadtest-smoke/ instead
#
# What it runs, in this order (every command is also written to $OUT/quiet-run.txt with its start time):
#   1. the bundled server with its KV cache: `python -m workload serve --port 0 --threads 1` (default
#      --max-batch 8), its admin token in a 0600 file (--admin-token-file), never on a command line;
#   2. normal       `infersight loadtest` against it, --repeats 2 (the run-to-run noise), JSON + HTML;
#   3. gc-fault     the same after `python -m workload fault gc on`, switched off after;
#   4. no-cache     the same against a second server started with --no-cache (stopped after);
#   5. normal-rerun the identical command as 2, for "no difference beyond noise";
#   6. sweep        `infersight loadtest --sweep max-batch=1,2,4,8` (it starts one server per value);
#   7. compare      normal vs gc-fault, normal vs no-cache, normal vs normal-rerun.
# Beside every load test runs benchmarks/proc_threads.py, the independent /proc reading of the server's
# threads (busiest thread's CPU, run-queue wait, context switches), one CSV row a second.
#
# Outputs, in $OUT (default docs/loadtest):
#   quiet-run.txt                       host state at the start, each command with its start time
#   quiet-NAME.json                     the reports (NAME: normal, gc-fault, no-cache, normal-rerun)
#   quiet-normal.html                   the offline HTML report of the normal run
#   quiet-NAME.log                      the load test's progress, each line prefixed with its unix time
#   quiet-NAME.threads.csv              the independent reading (column t: unix time, to align with the log)
#   quiet-sweep-max-batch.json, .txt (the table, optimum marked), .log, quiet-sweep-max-batch-V.threads.csv
#                                       (one per value; the sweep JSON is a sweep, not a report: tests that
#                                       load every docs/loadtest/*.json as a report must skip it)
#   quiet-compare-gc-fault.txt, quiet-compare-no-cache.txt, quiet-compare-rerun.txt
#
# Knobs (environment): PYTHON (relative to the repository root), OUT, SCHEDULE, SLO, REPEATS, SWEEP,
# SWEEP_SCHEDULE, SWEEP_REPEATS, MAX_BUSY (host CPU share above which it refuses to start, default 0.25),
# FORCE=1 (start anyway).
#
# Schedule: the runs stop after the first step that breaks the SLO, so a wide geometric schedule costs only
# the steps up to the knee. On the shared host (load 11-32) the cache server broke at 8 req/s with the
# decode thread at 0.4 core (docs/loadtest/lt-normal.json), about 0.05 core-second per request, so one idle
# core is expected to carry ~15-25 req/s; the GC fault (4000 reference cycles per sequence per decode step)
# and the missing KV cache (every step recomputes the sequence, 4-15x slower in docs/BENCHMARKS.md) should
# break several steps lower (no-cache broke at 4 req/s in a 2 s smoke step on the busy host, 1-1.5 req/s
# achieved): 0.5 req/s is the lowest step so that the faulted runs get a step that passes. The sweep
# starts at 2 req/s (max-batch 1 is the cache server without batching, which carries more than that).
set -euo pipefail

cd "$(dirname "$0")/../.."   # the repository root

if [[ -n "${SMOKE:-}" ]]; then
    OUT=${OUT:-build/loadtest-smoke}
    SCHEDULE=${SCHEDULE:-1:2,4:2}
    REPEATS=${REPEATS:-1}
    SWEEP=${SWEEP:-max-batch=1,8}
    SWEEP_SCHEDULE=${SWEEP_SCHEDULE:-$SCHEDULE}
    SWEEP_REPEATS=${SWEEP_REPEATS:-1}
    FORCE=1
fi
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-docs/loadtest}
SCHEDULE=${SCHEDULE:-0.5:10,1:10,2:10,4:10,8:10,12:10,16:10,24:10,32:10,48:10}
SLO=${SLO:-1}
REPEATS=${REPEATS:-2}
SWEEP=${SWEEP:-max-batch=1,2,4,8}
SWEEP_SCHEDULE=${SWEEP_SCHEDULE:-2:10,4:10,8:10,12:10,16:10,24:10,32:10,48:10}
SWEEP_REPEATS=${SWEEP_REPEATS:-1}
MAX_BUSY=${MAX_BUSY:-0.25}
SWEEP_NAME="sweep-${SWEEP%%=*}"

# Options every load test shares (the request shape and the SLO's error budget are the defaults, spelled out).
COMMON=(--slo-p95 "$SLO" --max-error-rate 0.01 --prompt-bytes 64-256 --max-tokens 16-48 --timeout 30 --seed 0)
IS=("$PY" -m agent.cli)   # `infersight` from this checkout

die() { echo "record.sh: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "must run as root (the load test attaches BPF probes and py-spy)"
[[ -x $PY ]] || die "no python at $PY (set PYTHON=/path/to/.venv/bin/python)"
mkdir -p "$OUT"
TMP=$(mktemp -d /tmp/infersight-record.XXXXXX)
RUNLOG="$OUT/quiet-run.txt"

# ---------------------------------------------------------------- cleanup: every process this script started
SERVERS=()   # pids of servers started here
READERS=()   # pids of proc_threads readers started here
BACKGROUND=()  # the load test running now (and the sweep's watcher)
cleanup() {
    local rc=$? p i
    set +e
    trap - EXIT INT TERM
    for p in "${BACKGROUND[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${READERS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    # The sweep stops its own servers on SIGTERM; whatever it left (and its readers) are listed here.
    [[ -f $TMP/sweep-pids ]] && while read -r p; do kill -TERM "$p" 2>/dev/null; done <"$TMP/sweep-pids"
    for p in "${SERVERS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for i in $(seq 40); do   # the server switches its faults off and stops its scheduler on SIGTERM
        local alive=0
        for p in "${SERVERS[@]}" "${BACKGROUND[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.5
    done
    for p in "${SERVERS[@]}" "${BACKGROUND[@]}"; do kill -KILL "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$TMP"
    ((rc == 0)) || echo "record.sh: failed (exit $rc); outputs so far are in $OUT" >&2
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

note() { printf '%(%Y-%m-%dT%H:%M:%SZ)T  %s\n' -1 "$*" | tee -a "$RUNLOG" >&2; }
stamp() { local line; while IFS= read -r line; do printf '%(%s)T %s\n' -1 "$line"; done; }
quote() { printf '%q ' "$@"; }

# ---------------------------------------------------------------- the host must be quiet
busy_share() {   # share of all CPUs busy over 5 s, from /proc/stat
    local a b
    a=($(head -1 /proc/stat)); sleep 5; b=($(head -1 /proc/stat))
    local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) total=0 k
    for k in 1 2 3 4 5 6 7 8; do total=$(( total + b[k] - a[k] )); done
    awk -v i="$idle" -v t="$total" 'BEGIN { printf "%.2f", (t > 0 ? 1 - i / t : 0) }'
}
BUSY=$(busy_share)
{
    echo "# docs/loadtest/record.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "host: $(nproc) CPUs, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg), CPU busy $BUSY over 5 s before starting"
    echo "settings: SCHEDULE=$SCHEDULE SLO=$SLO REPEATS=$REPEATS SWEEP=$SWEEP SWEEP_SCHEDULE=$SWEEP_SCHEDULE SWEEP_REPEATS=$SWEEP_REPEATS${SMOKE:+ SMOKE=1}"
    echo "top CPU users before starting:"
    ps -eo pcpu=,pid=,comm= --sort=-pcpu | head -5 | sed 's/^/    /'
} >"$RUNLOG"
cat "$RUNLOG" >&2
if awk -v b="$BUSY" -v m="$MAX_BUSY" 'BEGIN { exit !(b > m) }' && [[ -z ${FORCE:-} ]]; then
    die "the host is not quiet: CPU $BUSY busy (> MAX_BUSY=$MAX_BUSY); wait, or FORCE=1 to record anyway"
fi

# ---------------------------------------------------------------- helpers
umask 077
head -c 24 /dev/urandom | base64 >"$TMP/token"   # 0600 through the umask; the server refuses a readable one
umask 022

SRV_URL= SRV_PID=
start_server() {   # NAME [serve flags...]: sets SRV_URL and SRV_PID once /health answers
    local name=$1; shift
    local cmd=("$PY" -m workload serve --port 0 --threads 1 --admin-token-file "$TMP/token" "$@")
    note "server $name: $(quote "${cmd[@]}")"
    "${cmd[@]}" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    SERVERS+=($!)
    local bg=$! i line
    for i in $(seq 360); do
        line=$(grep -m1 '^workload: serving' "$TMP/$name.out" || true)
        [[ -n $line ]] && break
        kill -0 "$bg" 2>/dev/null || die "server $name exited: $(tail -n 3 "$TMP/$name.err")"
        sleep 0.5
    done
    [[ -n $line ]] || die "server $name printed no URL in 180 s: $(tail -n 3 "$TMP/$name.err")"
    SRV_URL=$(sed -E 's/.* at (http:\/\/[0-9.]+:[0-9]+) .*/\1/' <<<"$line")
    SRV_PID=$(sed -E 's/.* pid ([0-9]+)$/\1/' <<<"$line")
    [[ $SRV_PID == "$bg" ]] || die "server $name: printed pid $SRV_PID, started $bg"
    for i in $(seq 60); do
        curl -fsS -m 2 "$SRV_URL/health" >/dev/null 2>&1 && { note "server $name: $SRV_URL pid $SRV_PID healthy"; return; }
        sleep 0.5
    done
    die "server $name at $SRV_URL did not answer /health in 30 s"
}

stop_server() {   # PID
    kill -TERM "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

scheduler_tid() {   # URL: the decode (scheduler) thread's id, from /admin/debug (token read from the file)
    "$PY" - "$1" "$TMP/token" <<'EOF'
import json, sys, urllib.request
url, token = sys.argv[1], open(sys.argv[2]).read().strip()
req = urllib.request.Request(url + "/admin/debug", headers={"Authorization": f"Bearer {token}"})
print(json.load(urllib.request.urlopen(req, timeout=10))["scheduler_tid"])
EOF
}

fault() {   # NAME on|off URL
    local cmd=("$PY" -m workload fault "$1" "$2" --url "$3" --token-file "$TMP/token")
    note "$(quote "${cmd[@]}")"
    "${cmd[@]}" >&2
}

start_reader() {   # PID CSV [TID]
    "$PY" -m benchmarks.proc_threads "$1" --csv "$2" ${3:+--tid "$3"} >/dev/null &
    READERS+=($!)
}

stop_readers() {
    local p
    for p in "${READERS[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    READERS=()
}

loadtest() {   # NAME PID URL TID [more loadtest options...]
    local name=$1 pid=$2 url=$3 tid=$4; shift 4
    local cmd=("${IS[@]}" loadtest --url "$url" --pid "$pid" --schedule "$SCHEDULE" "${COMMON[@]}"
               --repeats "$REPEATS" --label "$name" -o "$OUT/quiet-$name.json" "$@")
    note "$name: $(quote "${cmd[@]}")"
    start_reader "$pid" "$OUT/quiet-$name.threads.csv" "$tid"
    in_background "$OUT/quiet-$name.log" "${cmd[@]}"
    stop_readers
}

# Run a command in the background and wait for it, so that a signal to this script stops it at once (the
# trap sends it SIGTERM: the load test unloads its probes) rather than after it ends. Its output (progress
# and summary) goes to LOG, each line prefixed with the unix time, and to this script's stderr.
in_background() {   # LOG COMMAND...: the command's exit status
    local log=$1 pid rc=0 p keep=(); shift
    "$@" > >(stamp | tee "$log" >&2) 2>&1 &
    pid=$!
    BACKGROUND+=("$pid")
    wait "$pid" || rc=$?
    for p in "${BACKGROUND[@]}"; do [[ $p == "$pid" ]] || keep+=("$p"); done
    BACKGROUND=("${keep[@]}")
    return "$rc"
}

# Readers for the servers a sweep starts itself: find each as a child of the sweep's process.
watch_sweep() {   # LOADTEST_PID
    local lt=$1 seen=" " pid value
    while kill -0 "$lt" 2>/dev/null; do
        for pid in $(pgrep -P "$lt" -f 'workload serve' || true); do
            [[ $seen == *" $pid "* ]] && continue
            seen+="$pid "
            value=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | sed -nE 's/.*--(max-batch|http-threads) ([0-9]+).*/\2/p')
            echo "$pid" >>"$TMP/sweep-pids"
            "$PY" -m benchmarks.proc_threads "$pid" --csv "$OUT/quiet-${SWEEP_NAME}-${value:-x}.threads.csv" >/dev/null &
            echo "$!" >>"$TMP/sweep-pids"
        done
        sleep 0.2
    done
}

# ---------------------------------------------------------------- the runs
START=$SECONDS
start_server cache
CACHE_URL=$SRV_URL CACHE_PID=$SRV_PID
CACHE_TID=$(scheduler_tid "$CACHE_URL")
note "server cache: scheduler (decode) thread tid $CACHE_TID"

loadtest normal "$CACHE_PID" "$CACHE_URL" "$CACHE_TID" --server-max-batch 8 --html "$OUT/quiet-normal.html"

fault gc on "$CACHE_URL"
loadtest gc-fault "$CACHE_PID" "$CACHE_URL" "$CACHE_TID" --server-max-batch 8
fault gc off "$CACHE_URL"

start_server no-cache --no-cache
NOCACHE_URL=$SRV_URL NOCACHE_PID=$SRV_PID
NOCACHE_TID=$(scheduler_tid "$NOCACHE_URL")
note "server no-cache: scheduler (decode) thread tid $NOCACHE_TID"
loadtest no-cache "$NOCACHE_PID" "$NOCACHE_URL" "$NOCACHE_TID" --server-max-batch 8
stop_server "$NOCACHE_PID"

loadtest normal-rerun "$CACHE_PID" "$CACHE_URL" "$CACHE_TID" --server-max-batch 8
stop_server "$CACHE_PID"   # the sweep starts its own servers: keep the host to one

SWEEP_CMD=("${IS[@]}" loadtest --sweep "$SWEEP" --schedule "$SWEEP_SCHEDULE" "${COMMON[@]}"
           --repeats "$SWEEP_REPEATS" -o "$OUT/quiet-$SWEEP_NAME.json")
note "$SWEEP_NAME: $(quote "${SWEEP_CMD[@]}")"
"${SWEEP_CMD[@]}" >"$OUT/quiet-$SWEEP_NAME.txt" 2> >(stamp | tee "$OUT/quiet-$SWEEP_NAME.log" >&2) &
SWEEP_PID=$!
BACKGROUND+=("$SWEEP_PID")
watch_sweep "$SWEEP_PID" &
BACKGROUND+=($!)
wait "$SWEEP_PID"
cat "$OUT/quiet-$SWEEP_NAME.txt" >&2   # the table, optimum marked

for pair in gc-fault:gc-fault no-cache:no-cache normal-rerun:rerun; do
    after=${pair%%:*} tag=${pair##*:}
    cmd=("${IS[@]}" loadtest compare "$OUT/quiet-normal.json" "$OUT/quiet-$after.json")
    note "compare: $(quote "${cmd[@]}")"
    { echo "\$ infersight loadtest compare $OUT/quiet-normal.json $OUT/quiet-$after.json"; "${cmd[@]}"; } \
        >"$OUT/quiet-compare-$tag.txt"
    cat "$OUT/quiet-compare-$tag.txt" >&2
done

note "done in $(( (SECONDS - START) / 60 )) min $(( (SECONDS - START) % 60 )) s; outputs in $OUT/quiet-*"
