#!/usr/bin/env bash
# GPU smoke test of the trtllm-engine runtime on the demo family. Run it on a machine with an
# NVIDIA GPU and TensorRT-LLM 1.2.x, e.g. inside nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3
# with trtspec installed (its own venv is fine). Not part of `make test`: CI's CPU machines skip it.
#
# For each demo method it
#   1. builds the engines with the real trtllm-build:   trtspec build --runtime trtllm-engine
#   2. gets reference tokens from the torch runtime:    trtspec generate --local --no-spec --json
#   3. runs the target engine greedily with its speculative decoding on (Medusa / EAGLE choices,
#      lookahead (W, N, G)) through TensorRT-LLM's ModelRunnerCpp, out of trtspec's process,
#   4. requires the engine's tokens to equal the torch runtime's (speculation is lossless).
# With SMOKE_TRITON=1 it also serves each repository with Triton and checks the entry model's text.
#
# Environment:
#   TRTSPEC        trtspec command                       (default: trtspec)
#   TRTLLM_PYTHON  a python that imports tensorrt_llm    (default: python3)
#   METHODS        demo methods                          (default: draft-model medusa eagle lookahead)
#   OUT            work dir                              (default: /tmp/trtspec-gpu-smoke)
#   N              tokens to compare                     (default: 48)
#   SMOKE_TRITON   1: also serve with Triton and compare text (default: 0); the server binds
#                  127.0.0.1 and its model-repository API takes $TRTSPEC_ADMIN_KEY (random if unset)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TRTSPEC="${TRTSPEC:-trtspec}"
TRTLLM_PYTHON="${TRTLLM_PYTHON:-python3}"
METHODS="${METHODS:-draft-model medusa eagle lookahead}"
OUT="${OUT:-/tmp/trtspec-gpu-smoke}"
N="${N:-48}"
PROMPT="${PROMPT:-def fibonacci(n):
    \"\"\"Return the n-th Fibonacci number.\"\"\"
}"

die() { echo "gpu-smoke: $*" >&2; exit 1; }
command -v nvidia-smi >/dev/null || die "no nvidia-smi: this needs a GPU machine"
command -v trtllm-build >/dev/null || die "no trtllm-build on PATH: run inside the Triton TRT-LLM container"
"$TRTLLM_PYTHON" -c "import tensorrt_llm" 2>/dev/null || die "$TRTLLM_PYTHON cannot import tensorrt_llm"
[ -f "$ROOT/examples/models/MANIFEST.json" ] || die "demo family missing: run \`trtspec models train-demo\`"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$TRTLLM_PYTHON" -c "import tensorrt_llm; print('TensorRT-LLM', tensorrt_llm.__version__)"

failed=0
for m in $METHODS; do
  spec="$ROOT/examples/demo/$m.toml"
  echo "=== $m"
  "$TRTSPEC" build -c "$spec" --runtime trtllm-engine --out-engines "$OUT/engines" --out-repo "$OUT/repo"
  name="demo-$m"
  "$TRTSPEC" generate -c "$spec" --local --no-spec --json --no-stream -n "$N" -p "$PROMPT" > "$OUT/$m.ref.json"
  if ! METHOD="$m" ENGINES="$OUT/engines/$name" REPO="$OUT/repo/$name" REF="$OUT/$m.ref.json" \
       TOKENIZER="$ROOT/examples/models/target" PROMPT="$PROMPT" N="$N" "$TRTLLM_PYTHON" - <<'PY'
import json, os, re, sys
import torch
from transformers import AutoTokenizer
from tensorrt_llm.runtime import ModelRunnerCpp

method, engines, repo = os.environ["METHOD"], os.environ["ENGINES"], os.environ["REPO"]
ref = json.load(open(os.environ["REF"]))["tokens"]
tok = AutoTokenizer.from_pretrained(os.environ["TOKENIZER"])
ids = tok(os.environ["PROMPT"], add_special_tokens=False)["input_ids"]
cfg = open(os.path.join(repo, "tensorrt_llm", "config.pbtxt")).read()

def param(key):
    m = re.search(r'key: "%s"\s*value \{\s*string_value: "([^"]*)"' % key, cfg)
    return m.group(1) if m else None

def choices(s):  # the brace form the C++ backend parses, read the way model.py does
    return json.loads("[" + s.replace("{", "[").replace("}", "]") + "]")

kw = {}
if method == "medusa":
    kw["medusa_choices"] = choices(param("medusa_choices"))
elif method == "eagle":
    kw["eagle_choices"] = choices(param("eagle_choices"))
elif method == "lookahead":
    kw["lookahead_config"] = [int(param(k)) for k in
                              ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")]
runner = ModelRunnerCpp.from_dir(engine_dir=os.path.join(engines, "target"), rank=0, max_output_len=len(ref),
                                 **kw)
eos = tok.eos_token_id if tok.eos_token_id is not None else 0
out = runner.generate(batch_input_ids=[torch.tensor(ids, dtype=torch.int32)], max_new_tokens=len(ref),
                      end_id=eos, pad_id=eos, temperature=1.0, top_k=1, top_p=0.0, return_dict=True,
                      output_sequence_lengths=True)
torch.cuda.synchronize()
seq = out["output_ids"][0][0].tolist()[len(ids):int(out["sequence_lengths"][0][0])]
first = next((i for i, (a, b) in enumerate(zip(seq, ref)) if a != b), None)
if first is None and len(seq) >= len(ref):
    print(f"{method}: {len(ref)} tokens identical to the torch runtime")
    sys.exit(0)
print(f"{method}: MISMATCH at token {first}: engine {seq[:first + 5] if first is not None else seq} "
      f"vs torch {ref[:(first or 0) + 5]}", file=sys.stderr)
sys.exit(1)
PY
  then failed=1; fi

  if [ "${SMOKE_TRITON:-0}" = "1" ]; then
    "$TRTSPEC" --version >/dev/null
    "$TRTSPEC" repo install-upstream "$OUT/repo/$name"
    # the key stays in the environment: the command line below only references it
    export TRTSPEC_ADMIN_KEY="${TRTSPEC_ADMIN_KEY:-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
    launch=$(SPEC="$spec" REPO="$OUT/repo/$name" python3 - <<'PY'
import os
from trtspec.check import load_spec, spec_from_dict
from trtspec.backends import launch_command
from trtspec.repository.trtllm.launch import launch_shell
d = load_spec(os.environ["SPEC"]).to_dict()
d["runtime"].update(kind="trtllm-engine", device="cuda"); d["gpu"]["type"] = "h100"
print(launch_shell(launch_command(spec_from_dict(d), os.environ["REPO"], host="127.0.0.1")))
PY
)
    echo "$launch"
    bash -c "exec $launch" > "$OUT/$m.triton.log" 2>&1 &
    server=$!
    for _ in $(seq 1 120); do curl -fsS localhost:8000/v2/health/ready >/dev/null 2>&1 && break; sleep 2; done
    entry=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['entry_model'])" "$OUT/repo/$name/trtspec.repo.json")
    body=$(PROMPT="$PROMPT" N="$N" M="$m" python3 -c 'import json,os; d={"text_input": os.environ["PROMPT"], "max_tokens": int(os.environ["N"]), "top_k": 1, "temperature": 1.0, "stream": False, "exclude_input_in_output": True}
if os.environ["M"] == "draft-model": d["num_draft_tokens"] = 4
print(json.dumps(d))')
    got=$(curl -fsS -X POST "localhost:8000/v2/models/$entry/generate" -d "$body" || true)
    kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true
    if GOT="$got" REF="$OUT/$m.ref.json" python3 -c 'import json,os,sys; want=json.load(open(os.environ["REF"]))["text"]; got=json.loads(os.environ["GOT"] or "{}").get("text_output", ""); sys.exit(0 if got.startswith(want) or want.startswith(got) and got else 1)'; then
      echo "$m: Triton $entry text matches the torch runtime"
    else
      echo "$m: Triton $entry text differs (see $OUT/$m.triton.log): $got" >&2; failed=1
    fi
  fi
done
exit $failed
