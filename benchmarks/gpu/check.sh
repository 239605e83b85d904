#!/bin/bash
# Both kernel families against cuBLASLt on a GPU, with no Python package and no network there.
#
#   BUILD_ONLY=1 bash benchmarks/gpu/check.sh   on a build host: compile every case of cases.txt (sm_90a)
#                                               into .gpucheck/bin (CUTLASS headers: the installed
#                                               nvidia-cutlass, or CUTLASS_INCLUDE)
#   bash benchmarks/gpu/check.sh                on the GPU host (carry .gpucheck): run each case (verified
#                                               against cuBLASLt, then timed), cuBLASLt on each shape, a
#                                               second run of two cases for the spread, the SASS mix;
#                                               results.jsonl, log.txt and a table in $OUT
# CASES (a file like cases.txt) and ONLY (an egrep of case names) narrow it; DEADLINE (s) stops starting runs.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"
CASES=${CASES:-benchmarks/gpu/cases.txt}; B=.gpucheck/bin; OUT=${OUT:-$ROOT/.gpucheck/out}
mkdir -p "$B" "$OUT"
cases() { grep -v '^#' "$CASES" | grep -E "${ONLY:-.}" | grep -v '^ *$'; }

if [ -n "${BUILD_ONLY:-}" ]; then
  PY=${PYTHON:-$ROOT/.venv/bin/python}
  CUTLASS_INCLUDE=${CUTLASS_INCLUDE:-$("$PY" -c 'import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__) + "/source")' 2>/dev/null)}
  build() {  # one line of the cases file
    set -- $1
    local name=$1 family=$2 dtype=$3 m=$4 n=$5 k=$6 src=$B/$1.cu
    shift 6
    [ -x "$B/$name" ] && return 0
    { printf '#define GEMM_M %s\n#define GEMM_N %s\n#define GEMM_K %s\n' "$m" "$n" "$k"
      for kv in "$@"; do printf '#define %s %s\n' "${kv%%=*}" "${kv#*=}"; done
      printf '#include "%s_%s.cuh"\n' "$([ "$family" = cutlass ] && echo cutlass || echo gemm)" "$dtype"; } > "$src"
    local inc="-Ikernels/cuda"
    [ "$family" = cutlass ] && inc="-Ikernels/cutlass -Ikernels/cuda -I$CUTLASS_INCLUDE/include -I$CUTLASS_INCLUDE/tools/util/include"
    local t0=$SECONDS
    if nvcc -O3 -std=c++17 --expt-relaxed-constexpr -DNDEBUG -arch=sm_90a $inc -Xptxas -v -o "$B/$name" "$src" -ldl \
        > "$B/$name.log" 2>&1; then echo "built $name in $((SECONDS - t0)) s"
    else echo "BUILD FAIL $name: $(grep -m1 error "$B/$name.log")"; fi
  }
  export -f build; export B CUTLASS_INCLUDE
  cases | xargs -d '\n' -P "${JOBS:-$(nproc)}" -I{} bash -c 'build "$1"' _ {}
  exit 0
fi

exec > >(tee -a "$OUT/log.txt") 2>&1
LT=${CROQQ_CUBLASLT:-$(find /usr/local /opt /usr/lib -xdev -name 'libcublasLt.so.1[23]*' 2>/dev/null | head -1)}
export CROQQ_CUBLASLT=$LT
echo "cublasLt: ${LT:-NOT FOUND}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
tol() { case $1 in f16 | f16sp) echo "--atol 0.05 --rtol 0.02";; e4m3) echo "--atol 0.25 --rtol 0.06";; esac; }
peak() { case $1 in f16) echo 989.4;; *) echo 1978.9;; esac; }
run() {  # name dtype args...
  local name=$1 dtype=$2; shift 2
  [ $SECONDS -gt "${DEADLINE:-420}" ] && { echo "SKIP $name (deadline)"; return; }
  [ -x "$B/$name" ] || { echo "MISSING $name"; return; }
  echo "# $name $*"
  timeout 40 "$B/$name" --peak-tflops "$(peak "$dtype")" "$@" | sed "s/^{/{\"case\":\"$name\",\"args\":\"$*\",/" \
    | tee -a "$OUT/results.jsonl"
}
cases | while read -r name family dtype rest; do run "$name" "$dtype" $(tol "$dtype"); done
# FP8 fast accumulation is coarser than croqq's e4m3 tolerance: timed under a loose one, its error reported
cases | awk '/FAST_ACCUM=1/{print $1}' | while read -r name; do run "$name" e4m3 --atol 8 --rtol 0.06; done
cases | awk '!seen[$3" "$4" "$5" "$6]++{print $1, $3}' | while read -r name dtype; do run "$name" "$dtype" --cublas --no-verify; done
cases | awk 'NR<=1 || /cl_f16_coop/{print $1, $3}' | while read -r name dtype; do run "$name" "$dtype" $(tol "$dtype"); done
for name in $(cases | awk 'NR==1 || /cl_f16_coop|cl_e4m3_fast /{print $1}'); do
  cuobjdump --dump-sass "$B/$name" | grep -oE '\b(HGMMA|QGMMA|HMMA|UTMALDG|LDGSTS)[.A-Z0-9_]*' | sort | uniq -c \
    | sort -rn | head -4 | sed "s/^/$name: /"
done
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv
python3 - "$OUT/results.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{r['case']:16s} {r['kernel']:9s} {r['dtype']:5s} {r['m']}x{r['n']}x{r['k']:<6} {r['status']:12s} "
          f"{'verified' if r['verified'] else '-':8s} err {r['max_abs_err']:<7.3g} {r['tflops']:7.1f} TFLOPS "
          f"median {r['median_ms']:.4f} ms {r['detail'][:60]}")
PY
