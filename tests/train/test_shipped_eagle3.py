"""The shipped EAGLE-3 head for SmolLM2-135M-Instruct: its layout, size, manifest (hashes, data, budget,
acceptance), and `check` of its specs against the imported target (when `make smollm2` has run)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support import MODELS, ROOT
from trtspec.artifacts import heads as layouts, manifest

HEAD = MODELS / "smollm2-135m-instruct-eagle3"
TARGET = MODELS / "smollm2-135m-instruct"
pytestmark = pytest.mark.skipif(not (HEAD / "config.json").is_file(), reason="EAGLE-3 head not trained yet")


def test_shipped_head_is_a_small_fp16_eagle3_head_with_its_manifest():
    from trtspec.artifacts.weights import load_weights

    raw = json.loads((HEAD / "config.json").read_text())
    assert raw["architectures"] == [layouts.EAGLE3_ARCHITECTURE] and raw["target_hidden_size"] == 576
    assert raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]  # SmolLM2: 30 layers
    assert raw["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    w = load_weights(HEAD)
    assert sorted(w) == sorted(layouts.EAGLE3_TENSORS)
    assert all(v.dtype == torch.float16 for k, v in w.items() if k not in ("d2t", "t2d"))
    rec = manifest.read(HEAD / manifest.FILE_NAMES[manifest.TRAIN], manifest.TRAIN)
    assert rec["outputs"] == manifest.file_table(HEAD)
    assert sum(f["bytes"] for f in rec["outputs"].values()) <= 32 * 2**20
    assert rec["inputs"]["data"]["samples"] > 0 and rec["budget"]["steps_done"] > 0
    assert rec["acceptance"]["chain"]["matches_plain_greedy"].split("/")[0] == rec["acceptance"]["chain"][
        "matches_plain_greedy"].split("/")[1]


@pytest.mark.skipif(not (TARGET / "config.json").is_file(), reason="SmolLM2 not imported (make smollm2)")
@pytest.mark.parametrize("name", ["eagle3.toml", "eagle3-tree.toml"])
def test_shipped_specs_check_against_smollm2(name):
    from trtspec.check import load_spec
    from trtspec.methods import check_pair

    assert check_pair(load_spec(ROOT / "examples" / "smollm2" / name)).problems == []
