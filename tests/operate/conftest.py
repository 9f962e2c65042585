"""Fixtures of the operate tests: the tiny random family (as tests/runtime), built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.runtime import family

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def fam(tmp_path_factory) -> Path:
    root = family.build_family(tmp_path_factory.mktemp("operate-family"))
    family.save_noisy_copy(root / "target", root / "draft_near", noise=0.01, seed=7)
    return root
