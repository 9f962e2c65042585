#!/usr/bin/env bash
# The main job on the shipped demo family (what `make demo` runs):
#   1. speculative generation in-process (torch runtime), with acceptance stats;
#   2. build: engines/<name>/ + model_repository/<name>/;
#   3. serve: the bundled Triton server on free ports, in the background;
#   4. generate: stream a completion over gRPC, then print the stats;
#   5. stop the server (also on error or Ctrl-C).
set -euo pipefail
cd "$(dirname "$0")/../.."
TRTSPEC=${TRTSPEC:-.venv/bin/trtspec}
SPEC=${SPEC:-examples/demo/draft-model.toml}
PROMPT=${PROMPT:-'def quote(s):
    """Return a shell-escaped version of the string *s*."""
'}
export TRANSFORMERS_VERBOSITY=error

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1/4 in-process speculative generation ($SPEC)"
"$TRTSPEC" generate --local -c "$SPEC" -p "$PROMPT" --max-tokens 96
echo "(the same request without speculation, for comparison:)"
"$TRTSPEC" generate --local -c "$SPEC" -p "$PROMPT" --max-tokens 96 --no-spec --no-stream >/dev/null

step "2/4 trtspec build -c $SPEC"
"$TRTSPEC" build -c "$SPEC"

step "3/4 trtspec serve -c $SPEC (background, free ports)"
trap '"$TRTSPEC" serve -c "$SPEC" --stop >/dev/null 2>&1 || true' EXIT
"$TRTSPEC" serve -c "$SPEC" --grpc-port 0 --http-port 0 --metrics-port 0

step "4/4 trtspec generate -c $SPEC --stream (gRPC)"
"$TRTSPEC" generate -c "$SPEC" -p "$PROMPT" --max-tokens 96 --stream

step "stopping the server"
"$TRTSPEC" serve -c "$SPEC" --stop
trap - EXIT
