"""Greedy identity with speculation, for every method, on every architecture: outputs equal the same engine's
plain decoding (several requests batched together, sliding windows shorter than the sequences)."""

from __future__ import annotations

import pytest
import torch

from tests.architectures import models
from tests.runtime import family
from trtspec.runtime import SamplingParams

TARGETS = ["llama-yarn", "mistral-window", "qwen2-tied", "qwen3-bias-window"]
METHODS = {"draft-model": dict(method="draft-model", draft="draft_near"),
           "medusa": dict(method="medusa", k=5, choices=[[0], [1], [0, 0], [0, 1], [0, 0, 0]]),
           "eagle": dict(method="eagle", k=3), "lookahead": dict(method="lookahead", k=4)}
N_NEW = 24


@pytest.fixture(scope="module", params=TARGETS)
def arch_root(request, tmp_path_factory):
    model_type, kw = models.CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    models.save(root / "target", model_type, seed=1, **kw)
    family.save_noisy_copy(root / "target", root / "draft_near", noise=0.01, seed=7)
    family.save_medusa(root / "medusa", heads=3, hidden=64, vocab=family.VOCAB, seed=3)
    family.save_eagle(root / "eagle", seed=4, head_dim=16)
    return root


@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_speculation_equals_plain_decoding(arch_root, method):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, family.VOCAB - 1, (n,), generator=g).tolist() for n in (3, 11, 17, 26)]
    engine = family.engine(arch_root, batch=4, adaptive=False, **METHODS[method])
    try:
        spec = engine.generate_batch(prompts, SamplingParams(max_new_tokens=N_NEW))
        plain = engine.generate_batch(prompts, SamplingParams(max_new_tokens=N_NEW, num_draft_tokens=0))
    finally:
        engine.close()
    assert [r.tokens for r in spec] == [r.tokens for r in plain]
    assert all(len(r.tokens) > 0 for r in plain)
    assert sum(r.drafted for r in spec) > 0  # speculation ran
    if method == "draft-model":  # a near copy of the target: drafts get accepted, the accepted path is used
        assert sum(r.accepted for r in spec) > 0


def test_check_and_build_accept_every_architecture(arch_root, tmp_path):
    """The pair check (what `trtspec check` and the torch build run first) takes every architecture the
    runtime runs, and a torch build of it goes through."""
    from trtspec.backends import build
    from trtspec.builders import BuildOptions
    from trtspec.check import load_spec
    from trtspec.methods import check_pair

    spec = load_spec(family.write_spec(arch_root, "lookahead"))
    assert check_pair(spec).problems == []
    result = build(spec, BuildOptions(out_engines=tmp_path / "engines", out_repo=tmp_path / "repo", progress=False))
    assert (tmp_path / "engines").is_dir() and result.repository
