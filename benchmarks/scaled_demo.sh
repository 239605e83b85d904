#!/usr/bin/env bash
# The scaled demo (benchmarks/README.md, "The demo, scaled"): `croqq up --dtype f16 --max-iter 10` (or the
# sweep that DEMO_ARGS names: DEMO_ARGS="--dtype all" is the whole `make demo`) from the checkout given
# (its own cwd: `python -m croqq` imports the croqq of the folder it starts in, whatever PYTHONPATH
# says), with this checkout's .venv. Prints the wall time, `done in` and the whole machine's
# busy CPU from /proc/stat (kernel and jailed agents included: `time` misses what a bubblewrap jail's
# init never reaps), so run it on an otherwise idle machine.
# Usage: [DEMO_ARGS=...] benchmarks/scaled_demo.sh [CHECKOUT] [TAG]   (CROQQ_AGENT_JAIL etc. pass through)
set -euo pipefail
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv"
checkout="${1:-.}"
tag="${2:-scaled}"
read -r -a sweep <<<"${DEMO_ARGS:---dtype f16 --max-iter 10}"
run="${TMPDIR:-/tmp}/croqq-$tag"
busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
rm -rf "$run" && cd "$checkout"
b0=$(busy) && t0=$(date +%s.%N)
CROQQ_RUN_DIR="$run" CROQQ_RESULTS_REPO="$run/results" CROQQ_PROPOSER=agent CROQQ_AGENT=scripted \
  "$venv/bin/croqq" up "${sweep[@]}" --exit-when-done >"$run.log" 2>&1
t1=$(date +%s.%N) && b1=$(busy)
awk -v t0="$t0" -v t1="$t1" -v b0="$b0" -v b1="$b1" -v hz="$(getconf CLK_TCK)" -v tag="$tag" \
  -v done="$(grep 'done in' "$run.log" | tail -1)" -v logfile="$run.log" \
  'BEGIN { printf "%s: wall %.1f s, machine CPU %.1f s, %s (log %s)\n", tag, t1 - t0, (b1 - b0) / hz, done, logfile }'
