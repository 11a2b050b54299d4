#!/usr/bin/env bash
# The whole GPU check in one call: build flash-attn, run the CUDA tests, time decode steps and
# serve beside transformers. Everything it learns goes into OUTDIR (few files: summary.txt,
# stages.log, build.log, bench.txt, and the built flash-attn extension when it is small enough
# to carry back).
#
#   tools/gpu_check.sh OUTDIR [ASSETS]
#
# ASSETS (default _dev) holds what the GPU machine cannot download: flash_attn-2.8.3.tar.gz
# (the PyPI sdist), whl/ (wheels of missing packages, installed with --no-deps into
# /tmp/site), site/ (extra import paths), and optionally flash_attn_so.tar.xz* (a build
# brought back by an earlier run: then nothing is compiled).
#
# Each stage is time-boxed, and all share one budget (GPU_CHECK_BUDGET seconds, default 520):
# a stage that fails does not stop the next, a stage with too little time left is skipped,
# saying so. The stages run in order of what matters most. The flash-attn build is cached in
# /tmp/fa: a second call on the same (still warm) machine skips it; a fresh machine builds.
#
# GPU_CHECK_SKIP="stage names" skips those stages (a rerun of what failed, say).
# GPU_CHECK_DRY=1 runs the same stages on CPU (no build, float32, tiny workloads): a check of
# the script itself on a machine without a GPU.
set -u
OUT=${1:?usage: gpu_check.sh OUTDIR [ASSETS]}
ASSETS=$(cd "${2:-_dev}" 2>/dev/null && pwd || echo "${2:-_dev}")
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/stages.log SUM=$OUT/summary.txt BENCH=$OUT/bench.txt
: >"$LOG"; : >"$SUM"; : >"$BENCH"
START=$(date +%s)
DEADLINE=$((START + ${GPU_CHECK_BUDGET:-520}))
PY=${PYTHON:-python3}
DRY=${GPU_CHECK_DRY:-0}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
export KVLEDGER_CACHE_DIR=${KVLEDGER_CACHE_DIR:-/tmp/kvledger-cache}
FA=/tmp/fa/flash_attn-2.8.3
if [ "$DRY" = 1 ]; then
  DEVICE=cpu DTYPE=float32 BLOCK=16 REQS=4 C1=1 TOKENS=8 REPEATS=2 CTX=40
else
  DEVICE=cuda DTYPE=bfloat16 BLOCK=256 REQS=32 C1=4 TOKENS=128 REPEATS=30 CTX=512
fi

say() { echo "$*" | tee -a "$SUM" >>"$LOG"; }

# stage NAME LIMIT CMD...: run CMD under `timeout`, at most LIMIT seconds and never past the
# deadline; its output goes to stages.log, one line (rc, seconds) to summary.txt
stage() {
  local name=$1 limit=$2 now left t0 rc
  shift 2
  case " ${GPU_CHECK_SKIP:-} " in *" $name "*)
    say "$(printf '%-26s skipped (GPU_CHECK_SKIP)' "$name")"
    return 98 ;;
  esac
  now=$(date +%s)
  left=$((DEADLINE - now))
  if [ "$left" -lt 20 ]; then
    say "$(printf '%-26s skipped (%ss left)' "$name" "$left")"
    return 99
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name (limit ${limit}s) $(date +%T)" >>"$LOG"
  t0=$(date +%s)
  # a function runs in a child bash (exported below); timeout ends its whole process group
  timeout -k 5 "$limit" bash -c '"$@"' _ "$@" >>"$LOG" 2>&1
  rc=$?
  echo "=== $name rc=$rc $(($(date +%s) - t0))s" >>"$LOG"
  say "$(printf '%-26s rc=%-3s %4ss' "$name" "$rc" "$(($(date +%s) - t0))")"
  return $rc
}

env_report() {
  nvidia-smi -L || true
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv || true
  nvcc --version | tail -2 || true
  nproc
  "$PY" -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', \
torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
}

install_wheels() {
  [ -d "$ASSETS/whl" ] || { echo "no $ASSETS/whl: nothing to install"; return 0; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$ASSETS"/whl/*.whl
}

build_flash_attn() {
  if ls "$FA"/flash_attn_2_cuda*.so >/dev/null 2>&1; then
    echo "flash-attn: built earlier on this machine ($FA), not rebuilt"
    return 0
  fi
  rm -rf /tmp/fa && mkdir -p /tmp/fa
  tar xzf "$ASSETS/flash_attn-2.8.3.tar.gz" -C /tmp/fa || return 1
  if ls "$ASSETS"/flash_attn_so.tar.xz* >/dev/null 2>&1; then
    cat "$ASSETS"/flash_attn_so.tar.xz* | tar xJf - -C "$FA" && echo "flash-attn: carried build"
    return $?
  fi
  "$PY" tools/flash_attn_subset.py "$FA" --head-dims 32,64,96,128 || return 1
  # the worker's compiled CPU kernels (the CUDA tests' CPU references use them) build beside
  "$PY" -c "from worker import native; print('CPU kernels:', native.load())" \
    >"$OUT/cpu_kernels.tmp" 2>&1 &
  local cpu=$! t0=$(date +%s)
  (cd "$FA" && FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=90 MAX_JOBS=$(nproc) \
    NVCC_THREADS=2 "$PY" setup.py build_ext --inplace >"$OUT/build.log" 2>&1)
  local rc=$?
  echo "flash-attn build: rc=$rc in $(($(date +%s) - t0)) s on $(nproc) cores"
  wait $cpu; tail -c 300 "$OUT/cpu_kernels.tmp"; rm -f "$OUT/cpu_kernels.tmp"
  tail -5 "$OUT/build.log"
  return $rc
}

carry_back_build() {
  # the extension, xz-compressed, in parts of < 15 MiB (at most 3), for a later fresh machine
  (cd "$FA" && tar cf - flash_attn_2_cuda*.so) | xz -T0 -3 >/tmp/fa_so.tar.xz || return 1
  local size=$(stat -c %s /tmp/fa_so.tar.xz)
  echo "flash-attn extension: $(stat -c %s "$FA"/flash_attn_2_cuda*.so) bytes, xz $size"
  if [ "$size" -lt $((45 * 1024 * 1024)) ]; then
    split -b 15M -d /tmp/fa_so.tar.xz "$OUT/flash_attn_so.tar.xz."
  else
    echo "too large to carry back"
  fi
}

import_flash_attn() {
  "$PY" -c "import flash_attn, flash_attn_2_cuda; print('flash_attn', flash_attn.__version__, \
flash_attn_2_cuda.__file__)"
}

smol_dir() { "$PY" -c "from benchmarks.peers.models import model_dir; print(model_dir('smol'))"; }

forward() {  # MODEL GRAPH_MAX_BATCH
  set -o pipefail
  [ -n "$1" ] || { echo "no model"; return 2; }
  "$PY" benchmarks/worker_forward.py --model "$1" --cuda-graph-max-batch "$2" --device "$DEVICE" \
    --dtypes "$DTYPE" --batch-sizes 1,16 --block-size "$BLOCK" --prompt-len 128 \
    --context-len "$CTX" --repeats "$REPEATS" | tee -a "$BENCH"
}

peers() {  # SIZE
  set -o pipefail
  echo "--- peers $1 ($DEVICE, $DTYPE)" >>"$BENCH"
  "$PY" -m benchmarks.peers --size "$1" --engines kvledger,transformers --device "$DEVICE" \
    --dtype "$DTYPE" --requests "$REQS" --c1-requests "$C1" --max-tokens "$TOKENS" \
    --json "/tmp/peers_$1.json" | tee -a "$BENCH"
}

serve_defaults() {
  # `kvledger serve --device cuda` with nothing else: what the worker chose, and one request
  "$PY" - "$DEVICE" <<'EOF'
import sys, tempfile
from pathlib import Path
import openai
from tests.serving import start_serve
with tempfile.TemporaryDirectory() as tmp:
    served = start_serve(Path(tmp), "--device", sys.argv[1], debug_invariants=False)
    try:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0)
        out = client.completions.create(model="tiny-llama", prompt="hello " * 300, max_tokens=40,
                                        temperature=0, extra_body={"ignore_eos": True})
        print("completion tokens:", out.usage.completion_tokens)
    finally:
        served.stop()
    for line in (Path(tmp) / "serve.log").read_text().splitlines():
        if any(w in line for w in ("attention", "CUDA graphs", "KV blocks", "on cuda")):
            print(line[:300])
EOF
}

export -f env_report install_wheels build_flash_attn carry_back_build import_flash_attn \
  smol_dir forward peers serve_defaults
export OUT LOG BENCH PY ASSETS FA DEVICE DTYPE BLOCK REQS C1 TOKENS REPEATS CTX
say "gpu_check $(date -u +%FT%TZ) on $(hostname), budget $((DEADLINE - START)) s, dry=$DRY"
stage env 40 env_report
if [ "$DRY" != 1 ]; then
  stage wheels 60 install_wheels
  # the repository before the sdist (which has a tests/ folder of its own)
  export PYTHONPATH=/tmp/site:$ASSETS/site:$REPO:$FA${PYTHONPATH:+:$PYTHONPATH}
  stage build-flash-attn 360 build_flash_attn
  stage import-flash-attn 30 import_flash_attn && stage carry-back-build 40 carry_back_build
else
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
fi
grep -h "flash-attn build:" "$LOG" >>"$SUM"
# GPU_CHECK_TESTS="-k expr" narrows the CUDA tests (a rerun)
stage tests-cuda 170 "$PY" -m pytest -q -rA -p no:cacheprovider --timeout 150 \
  tests/worker/test_cuda.py tests/worker/test_cuda_graphs.py ${GPU_CHECK_TESTS:-}
SMOL=$(timeout 120 bash -c smol_dir 2>>"$LOG" | tail -1)
say "SmolLM2-shaped random model: ${SMOL:-not generated}"
stage forward-smol-graphs 100 forward "$SMOL" 64
stage peers-smol 150 peers smol
stage tests-e2e-cuda 150 "$PY" -m pytest -q -rA -p no:cacheprovider --timeout 140 \
  tests/e2e/test_consistency.py -k "cuda or flash"
stage forward-smol-eager 60 forward "$SMOL" 0
stage serve-defaults 90 serve_defaults
stage forward-tiny-graphs 60 forward tiny-llama 64
stage peers-tiny 90 peers tiny

{
  echo
  echo "--- tests (pass/fail lines)"
  grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$LOG" | grep -v "^===" | tail -80
  echo
  echo "--- serve-defaults"
  sed -n '/=== serve-defaults (/,/=== serve-defaults rc/p' "$LOG" | tail -12
  echo
  echo "--- bench (bench.txt)"
  grep -E "^\||greedy next|on cuda|on cpu|kvledger /|output tokens" "$BENCH"
  echo
  echo "total $(($(date +%s) - START)) s"
} >>"$SUM"
cat /tmp/peers_*.json >>"$BENCH" 2>/dev/null
cat "$SUM"
