#!/usr/bin/env bash
# The main job (what `make demo` runs), on the real demo model: SmolLM2-135M-Instruct (imported by `make smollm2`)
# with its shipped EAGLE-3 head (trained by `trtspec train eagle3`):
#   1. a chat prompt answered in-process (torch runtime) with speculation, then the same request without it,
#      and the speedup (same text: greedy speculation is lossless);
#   2. build: engines/<name>/ + model_repository/<name>/;
#   3. serve: the bundled Triton server on free ports, in the background;
#   4. generate: the same chat streamed over gRPC, then the stats;
#   5. stop the server (also on error or Ctrl-C).
# SPEC=examples/demo/draft-model.toml CHAT=0 PROMPT='def f(' runs it on the stdlib demo family instead (the
# tests' fast fixture).
set -euo pipefail
cd "$(dirname "$0")/../.."
TRTSPEC=${TRTSPEC:-.venv/bin/trtspec}
PY=${PY:-.venv/bin/python}
SPEC=${SPEC:-examples/smollm2/eagle3.toml}
CHAT=${CHAT:-1}
PROMPT=${PROMPT:-'Write a Python function that returns the squares of the even numbers in a list.'}
TOKENS=${TOKENS:-128}
export TRANSFORMERS_VERBOSITY=error
CHAT_FLAG=()
[ "$CHAT" = 1 ] && CHAT_FLAG=(--chat)

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

step "1/4 in-process: speculation on, then off ($SPEC)"
"$TRTSPEC" generate --local -c "$SPEC" "${CHAT_FLAG[@]}" -p "$PROMPT" --max-tokens "$TOKENS" --json >"$TMP/spec.json"
"$TRTSPEC" generate --local -c "$SPEC" "${CHAT_FLAG[@]}" -p "$PROMPT" --max-tokens "$TOKENS" --no-spec --json \
  >"$TMP/plain.json"
"$PY" - "$TMP/spec.json" "$TMP/plain.json" "$PROMPT" <<'EOF'
import json, sys
spec, plain = (json.load(open(p)) for p in sys.argv[1:3])
rate = lambda d: d["new_tokens"] / d["seconds"]
print(f"user: {sys.argv[3]}\n\n{spec['text'].strip()}\n")
print(f"with speculation ({spec['method']}): {spec['new_tokens']} tokens, {rate(spec):.1f} tok/s, "
      f"{spec['tokens_per_step']:.2f} tokens/step, acceptance {spec['acceptance_rate']:.2f}")
print(f"without:                      {plain['new_tokens']} tokens, {rate(plain):.1f} tok/s")
print(f"speedup {rate(spec) / rate(plain):.2f}x, same text: {spec['text'] == plain['text']}")
EOF

step "2/4 trtspec build -c $SPEC"
"$TRTSPEC" build -c "$SPEC"

step "3/4 trtspec serve -c $SPEC (background, free ports)"
trap '"$TRTSPEC" serve -c "$SPEC" --stop >/dev/null 2>&1 || true; rm -rf "$TMP"' EXIT
"$TRTSPEC" serve -c "$SPEC" --grpc-port 0 --http-port 0 --metrics-port 0

step "4/4 trtspec generate -c $SPEC --stream (gRPC)"
"$TRTSPEC" generate -c "$SPEC" "${CHAT_FLAG[@]}" -p "$PROMPT" --max-tokens "$TOKENS" --stream

step "stopping the server"
"$TRTSPEC" serve -c "$SPEC" --stop
trap 'rm -rf "$TMP"' EXIT
