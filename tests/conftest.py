from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Tests time nothing: every engine (in-process and served) prices K with this nominal, deterministic cost table
# (runtime/costs.py) instead of measuring one: a pass over n rows costs 1 + 0.05 (n - 1) decode steps, a draft
# step 0.1 of one.
NOMINAL_COSTS = {"verify": {"1": 1.0, "1024": 1.0 + 0.05 * 1023}, "draft": {"*": 0.1}}
if "TRTSPEC_COST_TABLE" not in os.environ:
    _dir = tempfile.mkdtemp(prefix="trtspec-costs-")
    with open(os.path.join(_dir, "nominal.json"), "w") as _f:
        json.dump(NOMINAL_COSTS, _f)
    os.environ["TRTSPEC_COST_TABLE"] = os.path.join(_dir, "nominal.json")
    atexit.register(shutil.rmtree, _dir, True)

# The shipped weights travel packed; `make install` restores them, and so does a plain `pytest` (a no-op when
# they are there).
from trtspec.artifacts import packed  # noqa: E402

packed.unpack(log=lambda line: None)

# The heavy modules every test session loads (torch, transformers' Llama, the runtime) hold ~10^6 objects that
# never die; each full (generation-2) collection walked them all: ~12 % of an in-process test's time (measured on
# tests/runtime/test_engine.py). Frozen, the collector skips them.
import gc  # noqa: E402

import torch  # noqa: E402, F401
from transformers import LlamaForCausalLM  # noqa: E402, F401

import trtspec.runtime.engine  # noqa: E402, F401

gc.collect()
gc.freeze()
