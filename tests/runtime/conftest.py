"""Shared fixtures: one tiny random family per session (built in a temp dir), and the demo family if present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.runtime import family
from tests.support import MODELS as DEMO_MODELS

torch.set_num_threads(1)



@pytest.fixture(scope="session")
def fam(tmp_path_factory) -> Path:
    """tiny random family: target, draft (independent), draft_near (target + noise), medusa, eagle, tokenizer."""
    root = family.build_family(tmp_path_factory.mktemp("family"))
    family.save_noisy_copy(root / "target", root / "draft_near", noise=0.01, seed=7)
    return root


@pytest.fixture(scope="session")
def hf_target(fam):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(fam / "target").eval()


@pytest.fixture(scope="session")
def demo_manifest():
    path = DEMO_MODELS / "MANIFEST.json"
    return json.loads(path.read_text()) if path.is_file() else None
