"""Shared fixtures: one tiny random family per session (built in a temp dir), and the demo family if present."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import family  # noqa: E402

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[2]
DEMO_MODELS = REPO / "examples" / "models"
DEMO_SPECS = REPO / "examples" / "demo"


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


def demo_ready(*names: str) -> bool:
    return all((DEMO_MODELS / n / "config.json").is_file() for n in names)


@pytest.fixture(scope="session")
def demo_manifest():
    path = DEMO_MODELS / "MANIFEST.json"
    return json.loads(path.read_text()) if path.is_file() else None
