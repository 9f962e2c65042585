#!/usr/bin/env bash
# GPU check of the torch runtime, for a CUDA machine that has PyTorch and transformers but no TensorRT-LLM, no
# Triton server and no network (minutes at a time, at most 64 MiB of files: this checkout with the demo family
# is enough). In under 8 minutes on an H100/H200 it runs bench/gpu_check.py:
#   1. identity: every method's greedy output = plain decoding = transformers' greedy, batch 1 and 4, on CUDA
#   2. lossless: sampled draft-model decoding follows the target's distribution (chi-square), on CUDA
#   3. a speedup table of the demo family at batch 1, 4 and 16 for every method
# and exits 0 only when every check passed. Not part of `make test`.
#
#   ci/gpu-check.sh [bench/gpu_check.py options]     e.g. --dtype bfloat16, --batches 1,4,16,64, --quick
#
# Environment:
#   PYTHON   a python with torch (CUDA) and transformers    (default: python3)
#   WHEELS   wheels of trtspec's pure-Python needs the machine lacks (pydantic, pydantic-core, annotated-types,
#            typing-inspection), installed with --no-index into a private dir (default: <repo>/.whl)
#   OUT      a dir for gpu-check.json and gpu-check.md  (default: none)
#   LIMIT_S  wall-clock limit of the check in seconds  (default: 480)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS:-$ROOT/.whl}"
LIMIT_S="${LIMIT_S:-480}"
cd "$ROOT"
export PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

die() { echo "gpu-check: $*" >&2; exit 2; }
command -v "$PYTHON" >/dev/null || die "no $PYTHON"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi

# What trtspec's runtime imports besides torch and transformers; the missing ones come from $WHEELS.
missing=$("$PYTHON" - <<'PY'
import importlib.util
need = ["torch", "transformers", "safetensors", "tokenizers", "numpy", "yaml", "tqdm", "typing_extensions",
        "pydantic", "pydantic_core", "annotated_types", "typing_inspection"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
  echo "gpu-check: missing $missing; installing from $WHEELS (no network)"
  compgen -G "$WHEELS/*.whl" >/dev/null || die "no wheels in $WHEELS for: $missing (pip download them on a networked machine)"
  site="$(mktemp -d "${TMPDIR:-/tmp}/trtspec-site.XXXXXX")"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$WHEELS"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
[ -f "$ROOT/examples/models/target/config.json" ] || die "the demo family is missing (examples/models)"
# The demo family's weights travel packed (examples/packed/); restored here, a no-op when they are there.
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m trtspec.artifacts.packed unpack || die "cannot restore examples/models"

args=("$@")
[[ " ${args[*]:-} " == *" --device "* ]] || args=(--device cuda "${args[@]}")
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  args+=(--json "$OUT/gpu-check.json")
fi
status=0
timeout "$LIMIT_S" "$PYTHON" "$ROOT/bench/gpu_check.py" "${args[@]}" | tee "${OUT:-/tmp}/gpu-check.md" || status=$?
[ "$status" = 124 ] && echo "gpu-check: stopped after ${LIMIT_S} s (LIMIT_S)" >&2
exit "$status"
