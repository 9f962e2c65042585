"""Row-exact attention (Llama.make_row_exact, on for quantized targets): a verify pass's rows — a chain, a
tree's nodes, rows of a batch at other lengths — give bit-for-bit the logits a one-row decode step gives at
the same position. That is what keeps speculation on an int8 target (on torch's int8 kernel, bf16 activations,
which round batched attention's ~1e-7 differences up to different greedy tokens) token-identical to plain
decoding."""

from __future__ import annotations

import pytest
import torch

from tests.runtime import family
from trtspec.runtime.cache import chain_inputs, tree_inputs
from trtspec.runtime.llama import Llama

N0 = 23  # prompt slots before the compared positions


@pytest.fixture(scope="module", params=["float32", "int8", "int8-torch"])
def model(request, tmp_path_factory) -> Llama:
    path = tmp_path_factory.mktemp("exact") / "m"
    family.save_llama(path, seed=5, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    m = Llama.from_dir(path, dtype="float32", max_seq=128)
    if request.param.startswith("int8"):
        from trtspec.runtime.quant import quantize_llama

        quantize_llama(m, "int8")
        if request.param == "int8-torch":  # the torch path (where the fused kernel cannot be built)
            for lw in m.layers:
                lw.fused = None
    m.make_row_exact()
    return m


def _prefill(m: Llama, cache, ids: list[int], row: int = 0) -> None:
    inp = chain_inputs([0], len(ids))
    m.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([ids]), row0=row)
    cache.lengths[row] = len(ids)


def _decode(m: Llama, prompt: list[int], path: list[int]) -> torch.Tensor:
    """Logits of plain decoding, one row and one token at a time, after each token of `path`."""
    cache = m.new_cache(1, 128)
    _prefill(m, cache, prompt)
    out = []
    for n, tok in enumerate(path):
        inp = chain_inputs([len(prompt) + n], 1)
        assert inp.mask is None  # a one-row decode step: no mask, every slot so far
        logits, _ = m.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([[tok]]))
        out.append(logits[0, 0])
    return torch.stack(out)


def test_a_chain_verify_pass_equals_decoding(model):
    g = torch.Generator().manual_seed(1)
    prompt, chain = torch.randint(0, 50, (N0,), generator=g).tolist(), torch.randint(0, 50, (6,), generator=g).tolist()
    cache = model.new_cache(1, 128)
    _prefill(model, cache, prompt)
    inp = chain_inputs([N0], len(chain))
    logits, _ = model.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([chain]))
    assert torch.equal(logits[0], _decode(model, prompt, chain))


def test_tree_nodes_equal_decoding_their_paths(model):
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 50, (N0,), generator=g).tolist()
    parents = (-1, 0, 0, 1, 2, 3)  # input 0: the pending token; each node's path runs through its ancestors
    toks = torch.randint(0, 50, (len(parents),), generator=g).tolist()
    cache = model.new_cache(1, 128)
    _prefill(model, cache, prompt)
    inp = tree_inputs([N0], [parents])
    logits, _ = model.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([toks]))
    for node in range(len(parents)):
        path, j = [], node
        while j >= 0:
            path.insert(0, j)
            j = parents[j]
        assert torch.equal(logits[0, node], _decode(model, prompt, [toks[i] for i in path])[-1]), node


def test_rows_of_a_batch_equal_decoding_alone(model):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 50, (n,), generator=g).tolist() for n in (N0, 9, 31)]
    chains = [torch.randint(0, 50, (3,), generator=g).tolist() for _ in prompts]
    cache = model.new_cache(len(prompts), 128)
    for row, p in enumerate(prompts):
        _prefill(model, cache, p, row)
    inp = chain_inputs([len(p) for p in prompts], 3)
    logits, _ = model.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor(chains))
    for row, (p, c) in enumerate(zip(prompts, chains)):
        assert torch.equal(logits[row], _decode(model, p, c)), row
