"""EAGLE-3 heads in the `eagle` method: the target's captured layers are transformers' hidden states, greedy
decoding with a reduced-vocabulary head is identical to plain decoding (chain and tree, batch 1 and 4), sampled
chains carrying q (0 outside the draft vocabulary) are lossless (the chi-square test the other drafters pass,
and it catches a wrong q), `check` rejects a head for another target, and the LLM API gets Eagle3."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from tests.runtime import family
from tests.runtime.test_rejection import chi2_z
from tests.train.eagle3_support import save_eagle3, save_target4, write_spec
from trtspec import methods
from trtspec.check import load_spec
from trtspec.runtime import SamplingParams, SpecEngine
from trtspec.runtime.llama import Llama

torch.set_num_threads(1)
TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("e3")
    target = save_target4(root / "target")
    return root, target, save_eagle3(root / "head", target, draft_vocab=48)


def test_captured_layers_are_the_outputs_of_those_transformers_layers(pair):
    from transformers import LlamaForCausalLM

    from trtspec.runtime.cache import chain_inputs

    root, target, _ = pair
    tgt = Llama.from_dir(target)
    tgt.capture_layers = (0, 1, 3)
    ids = torch.randint(1, 90, (1, 12), generator=torch.Generator().manual_seed(0))
    inp = chain_inputs([0], 12)
    _, feats = tgt.forward(tgt.new_cache(1, 32), inp.positions, inp.start, inp.mask, tokens=ids)
    hs = LlamaForCausalLM.from_pretrained(target).eval()(ids, output_hidden_states=True).hidden_states
    # hidden_states[i + 1] is layer i's output (pre-norm) for every layer but the last, whose entry is post-norm
    want = torch.cat([hs[1], hs[2]], -1)
    assert torch.allclose(feats[..., : 2 * 64], want, atol=1e-4)
    assert feats.shape[-1] == 3 * 64


@pytest.mark.parametrize("k,choices", [(4, None), (6, TREE)], ids=["chain", "tree"])
def test_greedy_identity_with_a_reduced_vocabulary_batch_1_and_4(pair, k, choices):
    root, target, head = pair
    plain = methods.engine(load_spec(write_spec(root, target, head, k=k, choices=choices, name=f"p{k}")))
    prompts = [torch.randint(1, 90, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (3, 9, 17, 5, 11)]
    sp0 = SamplingParams(max_new_tokens=30, num_draft_tokens=0)
    reference = [plain.generate(p, sp0).tokens for p in prompts]
    eng = methods.engine(load_spec(write_spec(root, target, head, k=k, choices=choices, name=f"s{k}")))
    assert type(eng.proposer).__name__ == "Eagle3Proposer"
    sp = SamplingParams(max_new_tokens=30, num_draft_tokens=k)
    single = [eng.generate(p, sp) for p in prompts]
    assert [r.tokens for r in single] == reference
    assert [r.tokens for r in eng.generate_batch(prompts, sp)] == reference
    assert sum(r.drafted for r in single) > 0


# ------------------------------------------------------------------------------------------------ sampling


@pytest.fixture(scope="module")
def v8(tmp_path_factory):
    """A vocab-8 target and an EAGLE-3 head whose draft vocabulary holds 6 of its 8 tokens."""
    root = tmp_path_factory.mktemp("e3v8")
    kw = dict(vocab_size=8, hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
              initializer_range=0.6, eos_token_id=None, bos_token_id=None)
    target = save_target4(root / "target", seed=21, **kw)
    head = save_eagle3(root / "head", target, draft_vocab=6, seed=9, scale=0.5, ffn=32)
    return root, target, head


def _counts(target, head, n, sp, prompt):
    from trtspec.methods.eagle3 import Eagle3Proposer

    eng = SpecEngine(Llama.from_dir(target), Eagle3Proposer(head, weight_dtype=torch.float32), num_draft_tokens=2,
                     max_batch_size=1024, max_input_len=8, max_output_len=8)
    res = eng.generate_batch([prompt] * n, [dataclasses.replace(sp, seed=1000 + i) for i in range(n)])
    counts = torch.zeros(8, 8)
    for r in res:
        counts[r.tokens[1], r.tokens[2]] += 1
    return counts, eng, res


def _exact(target: Llama, prompt, sp):
    from tests.runtime.test_engine import _first_tokens_exact

    return _first_tokens_exact(target, prompt, sp)


def test_sampled_eagle3_chain_is_lossless_end_to_end(v8):
    """20k seeded requests, one K=2 step after the prefill: the two tokens follow the target's processed joint
    distribution; the drafts are sampled from q on the draft vocabulary (never one of the 2 other tokens)."""
    root, target, head = v8
    sp = SamplingParams(max_new_tokens=3, temperature=0.9, top_k=6, num_draft_tokens=2)
    counts, eng, res = _counts(target, head, 20000, sp, [1, 2, 3])
    acc = sum(r.accepted for r in res) / sum(r.drafted for r in res)
    assert 0.1 < acc < 0.9
    assert chi2_z(counts, _exact(eng.target, [1, 2, 3], sp)) < 4.0


def test_the_sampling_check_catches_a_q_that_is_not_the_drafts(v8, monkeypatch):
    from trtspec.methods.eagle3 import Eagle3Proposer

    root, target, head = v8
    real = Eagle3Proposer._sampled_chain

    def wrong_q(self, batch):  # claim uniform q over the vocabulary: min(1, p/q) then accepts the wrong amount
        return [dataclasses.replace(d, q=torch.full_like(d.q, 1 / 8)) if d.q is not None else d
                for d in real(self, batch)]

    monkeypatch.setattr(Eagle3Proposer, "_sampled_chain", wrong_q)
    sp = SamplingParams(max_new_tokens=3, temperature=0.9, top_k=6, num_draft_tokens=2)
    counts, eng, _ = _counts(target, head, 20000, sp, [1, 2, 3])
    assert chi2_z(counts, _exact(eng.target, [1, 2, 3], sp)) > 8.0


def test_sampled_drafts_are_target_ids_with_q_zero_outside_the_draft_vocabulary(v8):
    from trtspec.artifacts.weights import load_weights
    from trtspec.methods.eagle3 import Eagle3Proposer
    from trtspec.runtime.cache import chain_inputs
    from trtspec.runtime.proposer import ProposalBatch

    root, target, head = v8
    t2d = load_weights(head)["t2d"]
    tgt = Llama.from_dir(target)
    prop = Eagle3Proposer(head, weight_dtype=torch.float32)
    prop.setup(tgt, 1, 32, 3)
    inp = chain_inputs([0], 3)
    _, feats = tgt.forward(tgt.new_cache(1, 32), inp.positions, inp.start, inp.mask, tokens=torch.tensor([[1, 2, 3]]))
    prop.admit(0, feats[0])
    g = torch.Generator().manual_seed(0)
    d = prop.propose(ProposalBatch([[1, 2, 3, 4]], [SamplingParams(temperature=1.0)], [3],
                                   [lambda n: torch.rand(n, generator=g).tolist()]))[0]
    assert d.q.shape == (3, 8) and torch.allclose(d.q.sum(-1), torch.ones(3))
    assert float(d.q[:, ~t2d].abs().sum()) == 0.0 and all(bool(t2d[t]) for t in d.tokens)


# --------------------------------------------------------------------------------------------- check, LLM API


def test_check_rejects_a_head_for_another_target(pair, tmp_path):
    from trtspec.methods import check_pair

    root, target, head = pair
    assert check_pair(load_spec(write_spec(tmp_path, target, head, name="ok"))).problems == []
    other = tmp_path / "other"
    family.save_llama(other, seed=3, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1)
    family.save_tokenizer(other)
    problems = [str(p) for p in check_pair(load_spec(write_spec(tmp_path, other, head, name="other"))).problems]
    assert any("target_hidden_size 64 differs from the target's hidden_size 32" in p for p in problems), problems
    short = tmp_path / "short"  # 2 layers: the head's layer 3 is not there
    family.save_llama(short, seed=3, num_hidden_layers=2)
    family.save_tokenizer(short)
    problems = [str(p) for p in check_pair(load_spec(write_spec(tmp_path, short, head, name="short"))).problems]
    assert any("captured layer 3 is not a layer of the target" in p for p in problems), problems


def test_check_rejects_a_trained_head_for_a_target_with_another_tokenizer(pair, tmp_path):
    import shutil

    from trtspec.artifacts import manifest
    from trtspec.methods import check_pair

    root, target, head = pair
    trained = tmp_path / "trained"
    shutil.copytree(head, trained)
    manifest.write(trained / "trtspec.train.json", manifest.new(
        manifest.TRAIN, 1, inputs={"target": {"tokenizer_sha256": "0" * 64}}, outputs={}))
    problems = [str(p) for p in check_pair(load_spec(write_spec(tmp_path, target, trained, name="tok"))).problems]
    assert any("trained on a target with another tokenizer" in p for p in problems), problems


def test_check_reports_a_config_that_disagrees_with_the_weights(pair, tmp_path):
    import shutil

    from trtspec.methods import check_pair

    root, target, head = pair
    bad = tmp_path / "bad"
    shutil.copytree(head, bad)
    raw = json.loads((bad / "config.json").read_text())
    raw["draft_vocab_size"] = 50
    (bad / "config.json").write_text(json.dumps(raw))
    problems = [str(p) for p in check_pair(load_spec(write_spec(tmp_path, target, bad, name="bad"))).problems]
    assert any("lm_head.weight" in p and "[50, 64]" in p for p in problems), problems


def test_both_spellings_of_the_captured_layers(pair, tmp_path):
    import shutil

    from trtspec.artifacts import heads as layouts
    from trtspec.errors import ModelError

    root, target, head = pair
    d = tmp_path / "h"
    shutil.copytree(head, d)
    raw = json.loads((d / "config.json").read_text())
    assert layouts.eagle3_config(d).aux_layers == (0, 1, 3)
    only_vllm = {k: v for k, v in raw.items() if k != "eagle_config"}
    (d / "config.json").write_text(json.dumps(only_vllm))
    assert layouts.eagle3_config(d).aux_layers == (0, 1, 3)  # vLLM's ids name layer inputs: each - 1
    (d / "config.json").write_text(json.dumps({**raw, "eagle_aux_hidden_state_layer_ids": [0, 1, 3]}))
    with pytest.raises(ModelError, match="name different layers"):
        layouts.eagle3_config(d)


def test_llmapi_serves_an_eagle3_head_with_its_captured_layers(pair, tmp_path):
    from trtspec.backends.trtllm_llmapi_methods import llmapi_method

    root, target, head = pair
    spec = load_spec(write_spec(tmp_path, target, head, name="llm"))
    sc = llmapi_method(spec).options(spec)["speculative_config"]
    assert sc["decoding_type"] == "Eagle3" and sc["eagle3_layers_to_capture"] == [0, 1, 3]
    assert sc["max_draft_len"] == 4 and sc["speculative_model"] == str(head.resolve())
