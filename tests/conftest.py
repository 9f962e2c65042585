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
