"""`trtspec train eagle3` on a tiny target: the head trains, saves in the EAGLE-3 layout, reloads, and the
served proposer's drafts equal a from-scratch recomputation with the training module; resuming a run gives
the same head as running it through; the data never holds a held-out prompt."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from tests.support import ROOT
from tests.train.eagle3_support import save_target4, write_prompts, write_spec
from trtspec.artifacts import heads as layouts
from trtspec.artifacts import manifest
from trtspec.artifacts.hf import ModelConfig
from trtspec.artifacts.weights import load_weights
from trtspec.errors import SpecError
from trtspec import methods
from trtspec.train import drafters, prompts
from trtspec.train.features import draft_vocabulary
from trtspec.train.kinds import head_config
from trtspec.train.samples import make_data
from trtspec.train.eagle3_head import Eagle3Head, reference_chain

torch.set_num_threads(1)
QUICK = dict(samples=12, max_new_tokens=16, gen_batch=4, draft_vocab=40, topk=8, steps=4, warmup=2, ttt_steps=3,
             batch_tokens=256, eval_prompts=2, eval_new_tokens=8, checkpoint_s=0.0, intermediate_size=96)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3")
    target = save_target4(root / "target")
    data = write_prompts(root / "prompts.jsonl")
    cfg = drafters.TrainConfig(data=str(data), **QUICK)
    m = drafters.train_eagle3(target, root / "head", cfg, work=root / "work",
                              weights=methods.get(drafters.METHOD["eagle3"]).weights)
    return root, target, root / "head", cfg, m


def test_the_head_is_written_in_the_eagle3_layout_with_its_manifest(tiny):
    root, target, head, cfg, m = tiny
    raw = json.loads((head / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLMEagle3"]
    assert raw["draft_vocab_size"] == 40 and raw["vocab_size"] == 96 and raw["target_hidden_size"] == 64
    assert raw["num_hidden_layers"] == 1 and raw["tie_word_embeddings"] is False
    aux = list(layouts.default_aux_layers(4))  # (0, 1, 3): three distinct layers of a 4-layer target
    assert raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == aux  # SpecForge: layer outputs
    assert raw["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in aux]  # vLLM: layer inputs
    w = load_weights(head)
    assert sorted(w) == sorted(layouts.EAGLE3_TENSORS)  # no embed_tokens: the target's is shared
    assert w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool and w["fc.weight"].dtype == torch.float16
    assert tuple(w["fc.weight"].shape) == (64, 3 * 64) and tuple(w["lm_head.weight"].shape) == (40, 64)
    assert tuple(w["midlayer.self_attn.q_proj.weight"].shape) == (64, 128)  # attention reads [emb; hidden]
    ids = w["d2t"] + torch.arange(40)
    assert int(w["t2d"].sum()) == 40 and bool(w["t2d"][ids].all())  # target id = draft id + d2t[draft id]
    rec = manifest.read(head / "trtspec.train.json", manifest.TRAIN)
    assert rec["inputs"]["data"]["samples"] == 12 and rec["budget"]["steps_done"] == 4
    assert rec["losses"]["history"] and rec["outputs"].keys() == {"config.json", "model.safetensors"}
    assert rec["acceptance"]["chain"]["matches_plain_greedy"] == "2/2"
    assert rec["acceptance"]["tree"]["matches_plain_greedy"] == "2/2"
    cfg3, _ = layouts.load_eagle3(head, ModelConfig.from_dir(target))
    assert cfg3.aux_layers == tuple(aux) and cfg3.draft_vocab_size == 40


def test_served_proposals_equal_a_from_scratch_recomputation(tiny):
    """The runtime's Eagle3Proposer (cached, plain tensors) vs the training module run over the whole prefix."""
    from trtspec.methods.eagle3 import Eagle3Proposer
    from trtspec.runtime import SamplingParams
    from trtspec.runtime.cache import chain_inputs
    from trtspec.runtime.llama import Llama
    from trtspec.runtime.proposer import ProposalBatch

    root, target, head_dir, cfg, _ = tiny
    tgt = Llama.from_dir(target)
    proposer = Eagle3Proposer(head_dir, device="cpu", weight_dtype=torch.float32)
    proposer.setup(tgt, 1, 128, 4)
    tcfg = ModelConfig.from_dir(target)
    c3, w = layouts.load_eagle3(head_dir, tcfg)
    head = Eagle3Head(head_config(tcfg, cfg), 64, w["d2t"] + torch.arange(40), tgt.embed)
    head.load_layout(w)
    for seed in range(3):
        prompt = torch.randint(1, 90, (9 + seed,), generator=torch.Generator().manual_seed(seed)).tolist()
        cache = tgt.new_cache(1, 128)
        inp = chain_inputs([0], len(prompt))
        logits, feats = tgt.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([prompt]))
        assert feats.shape[-1] == 3 * 64  # the captured layers, side by side
        seq = prompt + [int(logits[0, -1].argmax())]
        proposer.admit(0, feats[0])
        draft = proposer.propose(ProposalBatch([seq], [SamplingParams()], [4], [lambda n: [0.5] * n]))[0]
        assert draft.tokens == reference_chain(head, seq, feats[0], 4)
        assert all(bool(w["t2d"][t]) for t in draft.tokens)  # proposals are target ids of the draft vocabulary


def test_resuming_gives_the_head_of_an_uninterrupted_run(tiny, tmp_path):
    """A run killed after its 3rd step (checkpoints every step here) and resumed ends with the very weights
    of the run that was not interrupted; a checkpoint of another recipe is refused."""
    import dataclasses

    root, target, _, cfg, _ = tiny
    full = dataclasses.replace(cfg, steps=6, eval_prompts=0)
    drafters.train_eagle3(target, tmp_path / "full", full, work=tmp_path / "w1")

    def killed(phase, step, total, loss):
        if phase == "train" and step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        drafters.train_eagle3(target, tmp_path / "resumed", full, work=tmp_path / "w2", report=killed)
    assert not (tmp_path / "resumed").exists()  # nothing half-written
    m = drafters.train_eagle3(target, tmp_path / "resumed", full, work=tmp_path / "w2", resume=True)
    assert m["budget"]["steps_done"] == 6
    a, b = load_weights(tmp_path / "full"), load_weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(SpecError, match="another run"):
        drafters.train_eagle3(target, tmp_path / "x", dataclasses.replace(full, lr=1e-2), work=tmp_path / "w2",
                              resume=True)


def test_cli_trains_into_the_specs_heads_dir_and_needs_a_budget(tiny, tmp_path):
    from trtspec.cli import main

    root, target, _, _, _ = tiny
    spec = write_spec(tmp_path, target, tmp_path / "cli-head")
    data = root / "prompts.jsonl"
    args = ["train", "eagle3", "-c", str(spec), "--data", str(data), "--samples", "6", "--max-new-tokens", "8",
            "--draft-vocab", "32", "--batch-tokens", "128", "--work", str(tmp_path / "w")]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 64 and "no training budget" in r.output
    r = CliRunner().invoke(main, args + ["--steps", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["budget"]["steps_done"] == 2
    assert layouts.eagle_version(tmp_path / "cli-head") == 3


def test_builtin_prompt_sets_hold_no_benchmark_or_held_out_prompt():
    bench = {json.loads(line)["prompt"] for f in ("chat", "code")
             for line in (ROOT / "examples" / "smollm2" / f"{f}.jsonl").read_text().splitlines() if line.strip()}
    for name in prompts.SETS:
        train, held = prompts.split(prompts.prompt_set(name))
        assert len(train) > 400 and held and not set(held) & set(train)
        assert not bench & (set(train) | set(held))


def test_the_draft_vocabulary_is_the_most_frequent_trained_tokens():
    samples = [{"ids": [9, 1, 1, 1, 2, 2, 3, 7, 7, 7, 7], "prompt_len": 1}]  # the prompt (9) is not counted
    used = draft_vocabulary(samples, 3, 10, always=(5,))
    assert used.tolist() == [1, 5, 7]


def test_more_samples_answer_only_the_new_prompts(tiny, tmp_path):
    """Sample i is prompt i of a seeded order with its own seed: asking for more samples keeps the ones made
    (nothing answered again), asking for fewer takes the first ones."""
    import dataclasses
    import shutil

    from trtspec.artifacts.tokenizer import load_tokenizer

    root, target, _, cfg, _ = tiny
    shutil.copytree(root / "work", tmp_path / "w")
    tok = load_tokenizer(target)
    made = []
    report = lambda phase, step, total, loss: made.append(step)  # noqa: E731
    more = make_data(tmp_path / "w", target, dataclasses.replace(cfg, samples=14), tok, report, print)
    assert len(more["samples"]) == 14 and made == [14]  # one batch: the 2 new prompts
    fewer = make_data(tmp_path / "w", target, dataclasses.replace(cfg, samples=5), tok, report, print)
    assert fewer["samples"] == more["samples"][:5] and made == [14]
