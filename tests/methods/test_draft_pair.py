"""`trtspec check` on draft-model pairs of tiny models: a same-family pair passes; a drafter from another family
(SmolLM2 under a Qwen target: another vocabulary and tokenizer, another EOS), a drafter whose EOS differs and one
whose special tokens differ are each refused with a message that names what differs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.architectures import models
from tests.runtime import family
from trtspec.check import load_spec
from trtspec.methods import check_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    """root/{target (qwen2), draft (qwen2, smaller), smol (llama, another tokenizer and vocab, EOS 0)}."""
    root = tmp_path_factory.mktemp("pair")
    models.save(root / "target", "qwen2", seed=1)
    models.save(root / "draft", "qwen2", seed=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16)
    models.save(root / "smol", "llama", seed=3, tokenizer=False, vocab_size=120, eos_token_id=0)
    family.save_tokenizer(root / "smol", vocab=120)
    return root


def _spec(root: Path, draft: str) -> Path:
    return family.write_spec(root, "draft-model", target="target", draft=draft)


def _problems(root: Path, draft: str) -> list[str]:
    return [str(p) for p in check_pair(load_spec(_spec(root, draft))).problems]


def _copy(pair: Path, tmp_path: Path) -> Path:
    root = tmp_path / "pair"
    shutil.copytree(pair, root)
    return root


def test_a_same_family_pair_passes(pair):
    assert _problems(pair, "draft") == []


def test_another_familys_drafter_is_named_for_vocabulary_tokenizer_and_eos(pair):
    problems = _problems(pair, "smol")
    assert any("vocab_size 120 differs from the target's 96" in p for p in problems), problems
    assert any("its tokenizer differs from the target's: its vocabulary has 120 entries, the target's 96" in p
               for p in problems), problems
    assert any(f"its EOS token ids [0] differ from the target's [{family.EOS}]" in p for p in problems), problems


def test_a_drafter_whose_eos_differs_is_named(pair, tmp_path):
    root = _copy(pair, tmp_path)
    cfg = json.loads((root / "draft" / "config.json").read_text())
    (root / "draft" / "config.json").write_text(json.dumps({**cfg, "eos_token_id": 7}))
    gen = root / "draft" / "generation_config.json"
    gen.write_text(json.dumps({**json.loads(gen.read_text()), "eos_token_id": 7}))
    assert _problems(root, "draft") == [(
        f"speculative.draft = '{root / 'draft'}': its EOS token ids [7] differ from the target's [{family.EOS}] "
        "(fix: a drafter of the target's family ends text with the target's EOS; use one (or set eos_token_id in its "
        "config.json and generation_config.json to the target's))")]


def test_a_drafter_whose_special_tokens_differ_is_named(pair, tmp_path):
    root = _copy(pair, tmp_path)
    path = root / "draft" / "tokenizer.json"
    data = json.loads(path.read_text())
    added = [t for t in data["added_tokens"] if t["content"] == "</s>"]
    assert added, data["added_tokens"]
    added[0]["content"] = "<|im_end|>"
    path.write_text(json.dumps(data))
    problems = _problems(root, "draft")
    assert len(problems) == 1 and (f"its tokenizer differs from the target's: its special tokens differ: id "
                                   f"{family.EOS} is '<|im_end|>', in the target's '</s>'") in problems[0], problems


def test_check_exits_3_and_names_the_problem(pair):
    from trtspec.cli import main

    r = CliRunner().invoke(main, ["check", "-c", str(_spec(pair, "smol"))])
    assert r.exit_code == 3, r.output
    assert "vocab_size 120 differs from the target's 96" in r.output and "EOS token ids [0]" in r.output
    assert CliRunner().invoke(main, ["check", "-c", str(_spec(pair, "draft"))]).exit_code == 0
