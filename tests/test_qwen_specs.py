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
HEAD = ROOT / "examples" / "models" / "qwen2.5-coder-1.5b-instruct-eagle3"  # `make qwen-eagle3`
SPECS = sorted(QWEN.glob("*.toml"))
METHODS = {"plain": "none", "plain-int8": "none", "plain-w8a8": "none", "draft-model": "draft-model",
           "draft-model-int8": "draft-model", "draft-model-int8-draft": "draft-model",
           "draft-model-w8a8": "draft-model", "draft-model-w8a8-draft": "draft-model", "plain-w4a8": "none",
           "draft-model-w4a8": "draft-model", "draft-model-w4a8-draft": "draft-model",
           "draft-model-int8-w4a8-draft": "draft-model", "ngram": "ngram",
           "suffix": "suffix", "lookahead": "lookahead", "eagle3": "eagle"}
# the target's quantization by spec (the rest: none), and the drafter's (draft-model specs)
TARGET_QUANT = {"plain-int8": "int8", "draft-model-int8": "int8", "draft-model-int8-w4a8-draft": "int8",
                "plain-w8a8": "w8a8", "draft-model-w8a8": "w8a8",
                "plain-w4a8": "w4a8", "draft-model-w4a8": "w4a8"}
DRAFT_QUANT = {"draft-model-int8": "int8", "draft-model-int8-draft": "int8", "draft-model-w8a8": "w8a8",
               "draft-model-w8a8-draft": "w8a8", "draft-model-w4a8": "w4a8", "draft-model-w4a8-draft": "w4a8",
               "draft-model-int8-w4a8-draft": "w4a8"}


def test_every_method_has_its_spec():
    assert sorted(p.stem for p in SPECS if p.stem != "models") == sorted(METHODS)


@pytest.mark.parametrize("path", [p for p in SPECS if p.stem != "models"], ids=lambda p: p.stem)
def test_the_spec_serves_the_pair(path: Path):
    spec = load_spec(path)
    assert spec.speculative.method == METHODS[path.stem]
    assert Path(spec.model.target).resolve() == TARGET.resolve() and spec.model.dtype == "bfloat16"
    assert spec.model.quantization == TARGET_QUANT.get(path.stem)
    if spec.speculative.method == "draft-model":
        assert Path(spec.speculative.draft).resolve() == DRAFT.resolve() and spec.speculative.num_draft_tokens == 4
        assert spec.speculative.draft_quantization == DRAFT_QUANT.get(path.stem)
    if spec.speculative.method == "eagle":
        assert Path(spec.speculative.heads).resolve() == HEAD.resolve() and spec.speculative.num_draft_tokens == 4


@pytest.mark.skipif(not (TARGET / "trtspec.import.json").is_file() or not (DRAFT / "trtspec.import.json").is_file(),
                    reason="the Qwen pair is not imported (make qwen)")
@pytest.mark.parametrize("path", [p for p in SPECS if p.stem != "models"], ids=lambda p: p.stem)
def test_check_passes_on_the_imported_pair(path: Path):
    from trtspec.methods import check_pair

    if path.stem == "eagle3" and not (HEAD / "trtspec.train.json").is_file():
        pytest.skip("the EAGLE-3 head is not trained (make qwen-eagle3)")
    assert check_pair(load_spec(path)).problems == []


def test_the_head_corpus_is_plain_text_the_trainer_reads(tmp_path):
    """`make qwen-eagle3`'s training text: one {"text"} row per standard-library module, read as plain text."""
    import importlib.util
    import sysconfig

    from trtspec.train.samples import _read_data

    spec = importlib.util.spec_from_file_location("stdlib_corpus", QWEN / "stdlib_corpus.py")
    corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corpus)
    out = tmp_path / "corpus" / "stdlib.jsonl"
    corpus.main(out)
    mode, texts, held = _read_data(str(out))
    modules = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    assert mode == "text" and held == [] and len(texts) == len(modules)
    assert (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text() in texts
    assert list(out.parent.iterdir()) == [out]  # written atomically: no temp file left beside it
