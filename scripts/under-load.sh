#!/usr/bin/env bash
# The load harness: run pytest with busy processes beside it, K times, and say per test how often it passed.
#   scripts/under-load.sh [--count K] [--per-core P] [--no-load] [pytest args...]
#   scripts/under-load.sh -m timing --count 10          (every test that measures time or waits for an event)
#   scripts/under-load.sh --count 20 tests/health/test_health.py -k straggler
# It starts P (default 2) CPU burners per core (plain busy loops at the tests' own priority, as a CI machine or a
# laptop running other work has them), runs the tests K (default 1) times in a row with a JUnit file per round,
# stops the burners, and prints a table: each test's passes out of K and its median and slowest duration. The
# exit status is 0 only when every test passed every round. The JUnit files and the table stay in
# ${UNDER_LOAD_OUT:-under-load-out}/. --no-load runs the same rounds on a quiet machine (for a side-by-side).
set -uo pipefail
cd "$(dirname "$0")/.."
count=1 per_core=2 load=1
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --count) count=$2; shift 2 ;;
    --count=*) count=${1#*=}; shift ;;
    --per-core) per_core=$2; shift 2 ;;
    --per-core=*) per_core=${1#*=}; shift ;;
    --no-load) load=0; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$count$per_core" in *[!0-9]*) echo "under-load.sh: --count and --per-core take whole numbers (got $count, $per_core)" >&2; exit 2 ;; esac
PY=.venv/bin/python
[ -x "$PY" ] || { echo "under-load.sh: no .venv: run 'make test' (or make lint) once first to set it up" >&2; exit 2; }
out=${UNDER_LOAD_OUT:-under-load-out}
rm -rf "$out" && mkdir -p "$out"
burners=()
stop_burners() { [ ${#burners[@]} -gt 0 ] && kill "${burners[@]}" 2>/dev/null; wait "${burners[@]}" 2>/dev/null; burners=(); }
trap stop_burners EXIT
trap 'echo "under-load: stopped" >&2; exit 130' INT TERM  # (the EXIT trap stops the burners)
cores=$(nproc)
if [ "$load" = 1 ]; then
  for _ in $(seq $((cores * per_core))); do
    bash -c 'while :; do :; done' &
    burners+=($!)
  done
  echo "under-load: $((cores * per_core)) busy processes beside the tests ($per_core per core, $cores cores)"
fi
start=$(date +%s)
for i in $(seq "$count"); do
  echo "under-load: round $i/$count (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  .venv/bin/pytest -p no:cacheprovider -q -o addopts="" --junitxml="$out/round$i.xml" "${args[@]}" >"$out/round$i.log" 2>&1
  tail -n 1 "$out/round$i.log"
done
stop_burners
echo "under-load: $count round(s) in $(( $(date +%s) - start )) s"
"$PY" scripts/test_tables.py rounds "$out" "$count" | tee "$out/table.txt"
exit "${PIPESTATUS[0]}"
