"""`trtspec train medusa | eagle | draft-model` on a tiny target, through the eagle3 pipeline (the same data,
features and budget): each trains, saves the layout its method loads, reloads through that method's proposer,
and the proposer's drafts equal a from-scratch recomputation with the training module; a killed run resumes
to the weights of an uninterrupted one, and a larger budget extends a finished run."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner

from tests.train.eagle3_support import save_target4, write_prompts
from trtspec import methods
from trtspec.artifacts import heads as layouts, manifest
from trtspec.artifacts.hf import ModelConfig
from trtspec.artifacts.weights import load_file
from trtspec.train import drafters
from trtspec.train.features import make_hidden
from trtspec.train.recipe import silent
from trtspec.train.samples import make_data

torch.set_num_threads(1)
V = 96
# draft_vocab = the whole vocabulary: the training module's logits are then the served heads' logits
QUICK = dict(samples=12, max_new_tokens=16, gen_batch=4, draft_vocab=V, topk=8, steps=3, warmup=1, batch_tokens=256,
             eval_prompts=2, eval_new_tokens=8, checkpoint_s=0.0, intermediate_size=96, draft_layers=1, draft_hidden=32)


def _weights(kind: str) -> str:
    """The spec key of the drafter's dir, from the method that serves the kind (as `trtspec train` asks it)."""
    return methods.get(drafters.METHOD[kind]).weights


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One work dir (data, features, hidden states) shared by every kind, as on a real target."""
    root = tmp_path_factory.mktemp("drafters")
    target = save_target4(root / "target")
    data = write_prompts(root / "prompts.jsonl")
    cfg = drafters.TrainConfig(data=str(data), **QUICK)
    out = {kind: drafters.train_drafter(kind, target, root / kind, cfg, work=root / "work", weights=_weights(kind))
           for kind in ("medusa", "eagle", "draft-model")}
    return root, target, cfg, out


def _prefix(tgt, seed: int):
    from trtspec.runtime.cache import chain_inputs

    prompt = torch.randint(1, 90, (9 + seed,), generator=torch.Generator().manual_seed(seed)).tolist()
    cache = tgt.new_cache(1, 128)
    inp = chain_inputs([0], len(prompt))
    logits, hidden = tgt.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([prompt]))
    return prompt + [int(logits[0, -1].argmax())], hidden[0]


def _propose(proposer, seq, k=4):
    from trtspec.runtime import SamplingParams
    from trtspec.runtime.proposer import ProposalBatch

    return proposer.propose(ProposalBatch([seq], [SamplingParams()], [k], [lambda n: [0.5] * n]))[0].tokens


@pytest.mark.parametrize("kind", ["medusa", "eagle", "draft-model"])
def test_each_kind_writes_its_layout_and_a_manifest_with_measured_acceptance(tiny, kind):
    root, target, cfg, out = tiny
    m = manifest.read(root / kind / "trtspec.train.json", manifest.TRAIN)
    assert m["method"] == kind and m["created_by"] == f"trtspec train {kind}"
    assert m["budget"]["steps_done"] == 3 and m["losses"]["history"] and m["inputs"]["data"]["samples"] == 12
    assert m["acceptance"]["chain"]["matches_plain_greedy"] == "2/2"
    tcfg = ModelConfig.from_dir(target)
    if kind == "medusa":
        mc, w = layouts.load_medusa(root / kind, tcfg)
        assert (mc.num_heads == 4 and tuple(w["3.1.weight"].shape) == (V, 64)
                and w["0.0.linear.weight"].dtype == torch.float16)
    elif kind == "eagle":
        assert layouts.eagle_version(root / kind) == 1
        _, w = layouts.load_eagle(root / kind, tcfg)
        assert tuple(w["fc.weight"].shape) == (64, 128) and "fc.bias" in w
    else:
        d = ModelConfig.from_dir(root / kind)
        assert (d.num_layers, d.hidden_size, d.vocab_size) == (1, 32, V)
        assert (root / kind / "tokenizer.json").read_bytes() == (target / "tokenizer.json").read_bytes()
    # the eagle/draft-model runs reused the data and features the first run made; the final hidden states came
    # with those features (one target pass in all), and no kind stored the captured layers only EAGLE-3 reads
    assert not (root / "work" / "hidden.safetensors").exists()
    stored = load_file(root / "work" / "features.safetensors")
    assert "feats" not in stored and tuple(stored["hidden"].shape) == (len(stored["ids"]), 64)
    assert m["inputs"]["data"]["sha256"] == out["medusa"]["inputs"]["data"]["sha256"]
    assert m["budget"]["wall_s"]["features"] == out["medusa"]["budget"]["wall_s"]["features"]  # (cached: its cost)
    assert "hidden" not in m["budget"]["wall_s"]  # no second pass


def test_the_features_pass_gives_the_heads_their_hidden_states_and_eagle3_captures_its_layers_anew(tiny, tmp_path):
    """Medusa/EAGLE-1 read the final hidden states from the features pass (bit-equal to the separate pass they
    replaced); an EAGLE-3 run in the same work dir recomputes the features with its three captured layers, and a
    later Medusa run there takes the hidden states from their own pass."""
    import shutil

    from trtspec.artifacts.tokenizer import load_tokenizer

    root, target, cfg, _ = tiny
    work = tmp_path / "work"
    shutil.copytree(root / "work", work)
    quiet = silent, (lambda s: None)
    data = make_data(work, target, cfg, load_tokenizer(target), *quiet)
    hidden, _ = make_hidden(work, target, cfg, data, *quiet)
    assert torch.equal(hidden, load_file(work / "features.safetensors")["hidden"])
    (work / "hidden.safetensors").unlink()
    drafters.train_drafter("eagle3", target, tmp_path / "eagle3", cfg, work=work, until="features")
    stored = load_file(work / "features.safetensors")
    assert tuple(stored["feats"].shape) == (len(stored["ids"]), 3 * 64) and "hidden" not in stored
    m = drafters.train_drafter("medusa", target, tmp_path / "medusa", cfg, work=work, weights=_weights("medusa"))
    assert (work / "hidden.safetensors").is_file() and m["budget"]["wall_s"]["hidden"] >= 0
    assert m["acceptance"]["chain"]["matches_plain_greedy"] == "2/2"


def test_medusa_proposals_equal_the_training_module(tiny):
    from trtspec.methods.medusa import MedusaProposer
    from trtspec.runtime.llama import Llama
    from trtspec.train.modules import VocabMedusa

    root, target, cfg, _ = tiny
    tgt = Llama.from_dir(target)
    proposer = MedusaProposer(root / "medusa", device="cpu", weight_dtype=torch.float32)
    proposer.setup(tgt, 1, 128, 4)
    _, w = layouts.load_medusa(root / "medusa", ModelConfig.from_dir(target))
    heads = VocabMedusa(64, torch.zeros(V, 64), 4)
    with torch.no_grad():
        for h in range(4):
            heads.res[h].weight.copy_(w[f"{h}.0.linear.weight"].float())
            heads.res[h].bias.copy_(w[f"{h}.0.linear.bias"].float())
            heads.lm[h].copy_(w[f"{h}.1.weight"].float())
    assert float(w["0.0.linear.weight"].float().abs().sum()) > 0  # trained away from the identity start
    for seed in range(3):
        seq, hidden = _prefix(tgt, seed)
        proposer.admit(0, hidden)
        want = [int(heads.logits(h, hidden[-1]).argmax()) for h in range(4)]
        assert _propose(proposer, seq) == want


def test_eagle_proposals_equal_the_training_module_run_from_scratch(tiny):
    """EagleProposer (its KV cache, drafted entries dropped) vs the transformers layer over the whole prefix,
    each draft fed back with the head's own feature."""
    import torch.nn.functional as F

    from trtspec.methods.eagle import EagleProposer
    from trtspec.runtime.llama import Llama
    from trtspec.train.modules import EagleHead

    root, target, cfg, _ = tiny
    tgt = Llama.from_dir(target)
    proposer = EagleProposer(root / "eagle", device="cpu", weight_dtype=torch.float32)
    proposer.setup(tgt, 1, 128, 4)
    lc, w = layouts.load_eagle(root / "eagle", ModelConfig.from_dir(target))
    head = EagleHead(dataclasses.replace(lc, num_layers=1)).eval()
    head.load_state_dict({k: v.float() for k, v in w.items()})
    with torch.no_grad():
        for seed in range(3):
            seq, hidden = _prefix(tgt, seed)
            proposer.admit(0, hidden)
            toks, feats, want = list(seq[1:]), hidden, []
            for _ in range(4):
                pred = head(F.embedding(torch.tensor([toks]), tgt.embed), feats[None])[0]
                nxt = int(tgt.logits(pred[-1]).argmax())
                want.append(nxt)
                toks, feats = toks + [nxt], torch.cat([feats, pred[-1:]])
            assert _propose(proposer, seq) == want


def test_draft_model_proposals_equal_transformers_greedy(tiny):
    from transformers import LlamaForCausalLM

    from trtspec.methods.draft_model import DraftModelProposer
    from trtspec.runtime.llama import Llama

    root, target, cfg, _ = tiny
    tgt = Llama.from_dir(target)
    proposer = DraftModelProposer(root / "draft-model", weight_dtype=torch.float32)
    proposer.setup(tgt, 1, 128, 4)
    model = LlamaForCausalLM.from_pretrained(root / "draft-model", torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for seed in range(3):
            seq, _ = _prefix(tgt, seed)
            proposer.admit(0, None)
            ids, want = list(seq), []
            for _ in range(4):
                want.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
                ids.append(want[-1])
            assert _propose(proposer, seq) == want


def test_resume_continues_a_killed_run_and_extends_a_finished_one(tiny, tmp_path):
    """Medusa: killed after step 2, resumed: the weights of the uninterrupted 4-step run. Then --resume with
    --steps 6 continues the finished run to step 6 (it cannot restart: the checkpoint is there)."""
    import shutil

    root, target, cfg, _ = tiny
    four = dataclasses.replace(cfg, steps=4, eval_prompts=0)
    for w in ("w1", "w2"):
        shutil.copytree(root / "work", tmp_path / w, ignore=shutil.ignore_patterns("checkpoint*"))
    drafters.train_drafter("medusa", target, tmp_path / "full", four, work=tmp_path / "w1")

    def killed(phase, step, total, loss):
        if phase == "train" and step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        drafters.train_drafter("medusa", target, tmp_path / "resumed", four, work=tmp_path / "w2", report=killed)
    assert not (tmp_path / "resumed").exists()
    drafters.train_drafter("medusa", target, tmp_path / "resumed", four, work=tmp_path / "w2", resume=True)
    a, b = (layouts.load_medusa(tmp_path / d)[1] for d in ("full", "resumed"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    again = drafters.train_drafter("medusa", target, tmp_path / "again", four, work=tmp_path / "w2", resume=True)
    assert again["budget"]["steps_done"] == 4 and again["losses"]["final_loss_ema"] is not None  # no step ran
    m = drafters.train_drafter("medusa", target, tmp_path / "longer", dataclasses.replace(four, steps=6),
                               work=tmp_path / "w2", resume=True)
    assert m["budget"]["steps_done"] == 6
    state = json.loads((tmp_path / "w2" / "checkpoint-medusa" / "state.json").read_text())
    assert state["step"] == 6 and state["history"][0]["step"] == 1  # one run, continued


@pytest.mark.parametrize("kind", ["medusa", "eagle", "draft-model"])
def test_cli_verbs_train_with_a_budget(tiny, tmp_path, kind):
    from tests.train.eagle3_support import write_spec
    from trtspec.cli import main

    root, target, _, _ = tiny
    spec = write_spec(tmp_path, target, tmp_path / "unused")
    args = ["train", kind, "-c", str(spec), "--data", str(root / "prompts.jsonl"), "--samples", "12",
            "--max-new-tokens", "16", "--draft-vocab", str(V), "--batch-tokens", "128", "--work", str(root / "work"),
            "--out", str(tmp_path / "out")]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 64 and "no training budget" in r.output
    r = CliRunner().invoke(main, args + ["--steps", "1", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["budget"]["steps_done"] == 1
    assert manifest.read(tmp_path / "out" / "trtspec.train.json", manifest.TRAIN)["method"] == kind


@pytest.mark.parametrize("kind,where,what", [("medusa", "heads", "hidden"), ("eagle", "heads", "hidden"),
                                             ("draft-model", "draft", "vocab")])
def test_check_rejects_a_trained_drafter_for_another_target(tiny, tmp_path, kind, where, what):
    """A drafter trained for the tiny target, paired with a target of another width (or vocabulary): `check`
    names the mismatch before any build."""
    from trtspec.check import spec_from_dict
    from trtspec.methods import check_pair

    root, _, _, _ = tiny
    other = save_target4(tmp_path / "other", **({"hidden_size": 32} if what == "hidden" else {"vocab_size": 80}))
    spec = spec_from_dict({"schema": 1, "model": {"name": "x", "target": str(other), "dtype": "float32"},
                           "speculative": {"method": kind, "num_draft_tokens": 3, where: str(root / kind)},
                           "limits": {"max_batch_size": 1, "max_input_len": 16, "max_output_len": 8}})
    problems = [str(p) for p in check_pair(spec).problems]
    assert any(what in p for p in problems), problems
    same = spec_from_dict({**spec.to_dict(),
                           "model": {"name": "x", "target": str(root / "target"), "dtype": "float32"}})
    assert not check_pair(same).problems


def test_cli_never_replaces_another_kinds_drafter_by_default(tiny, tmp_path):
    """`train eagle -c SPEC` where the spec's heads dir holds a trained Medusa drafter: refused (exit 64) and
    the drafter untouched, instead of overwriting it."""
    from tests.train.eagle3_support import write_spec
    from trtspec.cli import main

    root, target, _, _ = tiny
    spec = write_spec(tmp_path, target, root / "medusa")  # method "eagle", heads = the Medusa heads
    before = (root / "medusa" / "medusa_lm_head.safetensors").read_bytes()
    r = CliRunner().invoke(main, ["train", "eagle", "-c", str(spec), "--steps", "1", "--work", str(root / "work")])
    assert r.exit_code == 64 and "holds a trained medusa drafter" in r.output, r.output
    assert (root / "medusa" / "medusa_lm_head.safetensors").read_bytes() == before
