"""The Qwen2.5-Coder pair's specs (examples/qwen/*.toml): each is a valid spec of the method its name says over
the imports of `make qwen`; with the imports present, `trtspec check`'s pair check passes on every one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import ROOT
from trtspec.check import load_spec

QWEN = ROOT / "examples" / "qwen"
TARGET = ROOT / "examples" / "models" / "qwen2.5-coder-1.5b-instruct"
DRAFT = ROOT / "examples" / "models" / "qwen2.5-coder-0.5b-instruct"
SPECS = sorted(QWEN.glob("*.toml"))
METHODS = {"plain": "none", "plain-int8": "none", "draft-model": "draft-model", "draft-model-int8": "draft-model",
           "draft-model-int8-draft": "draft-model", "ngram": "ngram", "suffix": "suffix", "lookahead": "lookahead"}


def test_every_method_has_its_spec():
    assert sorted(p.stem for p in SPECS if p.stem != "models") == sorted(METHODS)


@pytest.mark.parametrize("path", [p for p in SPECS if p.stem != "models"], ids=lambda p: p.stem)
def test_the_spec_serves_the_pair(path: Path):
    spec = load_spec(path)
    assert spec.speculative.method == METHODS[path.stem]
    assert Path(spec.model.target).resolve() == TARGET.resolve() and spec.model.dtype == "bfloat16"
    assert spec.model.quantization == ("int8" if path.stem in ("plain-int8", "draft-model-int8") else None)
    if spec.speculative.method == "draft-model":
        assert Path(spec.speculative.draft).resolve() == DRAFT.resolve() and spec.speculative.num_draft_tokens == 4
        assert spec.speculative.draft_quantization == ("int8" if "int8" in path.stem else None)


@pytest.mark.skipif(not (TARGET / "trtspec.import.json").is_file() or not (DRAFT / "trtspec.import.json").is_file(),
                    reason="the Qwen pair is not imported (make qwen)")
@pytest.mark.parametrize("path", [p for p in SPECS if p.stem != "models"], ids=lambda p: p.stem)
def test_check_passes_on_the_imported_pair(path: Path):
    from trtspec.methods import check_pair

    assert check_pair(load_spec(path)).problems == []
