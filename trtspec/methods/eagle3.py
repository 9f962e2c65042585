"""EAGLE-3 heads in the `eagle` method: the method reads the head's version (artifacts.heads.eagle_version) and
runs these parts for a version-3 head (layout and equations: trtspec/artifacts/heads.py, "EAGLE-3").

    weights        speculative.heads: LlamaForCausalLMEagle3 (fc over three target layers, `midlayer`, norm,
                   a reduced-vocabulary lm_head, d2t/t2d), what SpecForge writes and vLLM / TensorRT-LLM load
    torch          Eagle3Proposer: a chain (greedy: argmax; sampling: drawn from q, which lives on the draft
                   vocabulary and is 0 elsewhere, and verified with it) or the `choices` tree (top-i
                   candidates, verified as point masses); proposals are target ids (draft id + d2t)
    check          the head against the target: hidden sizes, vocabulary, the captured layers, the shapes in
                   the weights, and (when it was trained by `trtspec train`) the target's tokenizer
    runtimes       trtllm-engine converts EAGLE-1 heads only; the LLM API serves EAGLE-3 (its method table:
                   trtspec/backends/trtllm_llmapi_methods.py)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtspec.artifacts import heads as layouts, manifest, tokenizer
from trtspec.artifacts.hf import CONFIG
from trtspec.artifacts.weights import weight_shapes
from trtspec.errors import ModelError
from trtspec.methods.eagle import EagleProposer
from trtspec.runtime.proposer import EMPTY, Draft, DraftPlan, ProposalBatch, chain
from trtspec.spec import Problem

if TYPE_CHECKING:
    import torch

    from trtspec.artifacts.hf import ModelConfig
    from trtspec.runtime.cache import StepInputs
    from trtspec.runtime.llama import Llama

KEY = "speculative.heads"


class Eagle3Net:
    """The head's forward on plain tensors over a one-layer static KV cache (runtime.cache.KVCache): the
    equations of artifacts/heads.py, attention as the target's (causal or tree mask, RoPE of the head's
    config, GQA). `hidden` inputs are H wide: fc(target features) or the head's own previous outputs."""

    def __init__(self, cfg: layouts.Eagle3Config, w: dict[str, torch.Tensor], embed: torch.Tensor, *, dtype,
                 weight_dtype, device, max_seq: int):
        import torch

        from trtspec.runtime.llama import Linear, rope_tables

        c, m = cfg.layer, "midlayer."
        self.cfg, self.device, self.dtype = c, device, dtype
        get = lambda k: w[k].to(device=device, dtype=dtype)  # noqa: E731
        self.fc = Linear(get("fc.weight"), dtype=weight_dtype)
        self.in_norm, self.hid_norm = get(m + "input_layernorm.weight"), get(m + "hidden_norm.weight")
        a = m + "self_attn."
        self.qkv = Linear(torch.cat([get(a + f"{p}_proj.weight") for p in "qkv"]).contiguous(), dtype=weight_dtype)
        self.o = Linear(get(a + "o_proj.weight"), dtype=weight_dtype)
        self.mlp_norm = get(m + "post_attention_layernorm.weight")
        self.gate_up = Linear(torch.cat([get(m + "mlp.gate_proj.weight"), get(m + "mlp.up_proj.weight")]).contiguous(),
                              dtype=weight_dtype)
        self.down = Linear(get(m + "mlp.down_proj.weight"), dtype=weight_dtype)
        self.norm = get("norm.weight")
        self.head = Linear(get("lm_head.weight"), dtype=weight_dtype)
        for lin in (self.fc, self.qkv, self.o, self.gate_up, self.down, self.head):
            lin.min_rows = 1  # runs between target passes: its weights come from memory
        self.ids = (w["d2t"].long() + torch.arange(cfg.draft_vocab_size)).to(device)  # draft id -> target id
        self.vocab = c.vocab_size
        self.embed = embed
        cos, sin = rope_tables(c, max_seq)
        self.rope = torch.cat([cos, sin], -1).to(device=device, dtype=dtype)

    def new_cache(self, batch: int, max_seq: int):
        from trtspec.runtime.cache import KVCache

        return KVCache(1, batch, self.cfg.num_kv_heads, max_seq, self.cfg.head_dim, dtype=self.dtype,
                       device=self.device)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, cache, inp: StepInputs) -> torch.Tensor:
        """tokens [B, T] (x_{t+1}), hidden [B, T, H] -> the layer's outputs o_t [B, T, H] (K/V written)."""
        import torch
        import torch.nn.functional as F

        from trtspec.runtime.llama import _writer, apply_rope

        c = self.cfg
        H, nh, nkv, D, eps = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps
        B, T = tokens.shape
        mask, start = inp.mask, inp.start
        S = mask.shape[-1] if mask is not None else start[0] + T
        e = F.rms_norm(F.embedding(tokens, self.embed).to(self.dtype), (H,), self.in_norm, eps)
        h = F.rms_norm(hidden, (H,), self.hid_norm, eps)
        qkv = self.qkv(torch.cat([e, h], -1)).view(B, T, nh + 2 * nkv, D)
        cos, sin = F.embedding(inp.positions, self.rope).unsqueeze(2).chunk(2, dim=-1)
        qk = apply_rope(qkv[:, :, : nh + nkv], cos, sin)
        write = _writer(start, T, B, 0, self.device)
        write(cache.k[0], qk[:, :, nh:])
        write(cache.v[0], qkv[:, :, nh + nkv:])
        o = F.scaled_dot_product_attention(qk[:, :, :nh].transpose(1, 2), cache.k[0][:B, :, :S],
                                           cache.v[0][:B, :, :S], attn_mask=mask, enable_gqa=nh != nkv)
        x = hidden + self.o(o.transpose(1, 2).reshape(B, T, nh * D))
        gate, up = self.gate_up(F.rms_norm(x, (H,), self.mlp_norm, eps)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft logits scattered into the target's vocabulary: -inf for every token outside the draft's
        (so argmax/top-i are target ids, and a distribution made of them is 0 there)."""
        import torch
        import torch.nn.functional as F

        lg = self.head(F.rms_norm(out, (self.cfg.hidden_size,), self.norm, self.cfg.rms_norm_eps))
        full = torch.full((*lg.shape[:-1], self.vocab), float("-inf"), dtype=lg.dtype, device=lg.device)
        return full.index_copy_(-1, self.ids, lg)


class Eagle3Proposer(EagleProposer):
    """EAGLE-1's drafting loop (its row state, sync of real features, chain and tree) over an EAGLE-3 head:
    the target captures the head's three layers (Llama.capture_layers), `admit`/`commit` store fc(features)
    (H wide, like the head's own outputs that later steps feed), and a sampled chain carries q."""

    def setup(self, target: Llama, max_batch: int, max_seq: int, k: int) -> DraftPlan:
        from trtspec.runtime.llama import draft_dtype

        cfg, w = layouts.load_eagle3(self.path, target.cfg)
        nbytes = 4 * sum(v.numel() for k_, v in w.items() if k_.endswith("weight"))
        wdt = self.weight_dtype or draft_dtype(target.dtype, self.device, nbytes)
        self.head3 = Eagle3Net(cfg, w, target.embed, dtype=target.dtype, weight_dtype=wdt, device=self.device,
                               max_seq=max_seq)
        target.capture_layers = cfg.aux_layers
        self.cache = self.head3.new_cache(max_batch, max_seq)
        self.pending: list[list[torch.Tensor]] = [[] for _ in range(max_batch)]
        return self.plan(k)

    def admit(self, row: int, hidden: torch.Tensor) -> None:
        self.cache.lengths[row] = 0
        self.pending[row] = [self.head3.fc(hidden)]

    def commit(self, paths: list[list[int]], hidden: torch.Tensor) -> None:
        for b, path in enumerate(paths):
            self.pending[b].append(self.head3.fc(hidden[b, [0] + [j + 1 for j in path]]))

    def _run(self, tokens: torch.Tensor, feats: torch.Tensor, inp: StepInputs, last=None):
        h = self.head3.forward(tokens, feats, self.cache, inp)
        hs = h if last is None else h.gather(1, last[..., None].expand(-1, -1, h.shape[-1]))
        return self.head3.logits(hs), h

    def propose(self, batch: ProposalBatch) -> list[Draft]:
        if self.tree is not None or all(sp.greedy for sp in batch.params) or max(batch.ks) == 0:
            return super().propose(batch)  # top-i candidates: verified as point masses
        return self._sampled_chain(batch)

    def _sampled_chain(self, batch: ProposalBatch) -> list[Draft]:
        """A chain drawn from the head's processed distribution q (0 outside the draft vocabulary); each
        sampling row draws exactly its own k uniforms (its random stream does not depend on the batch)."""
        import torch

        from trtspec.runtime.cache import chain_inputs
        from trtspec.runtime.sampling import processed_probs, sample

        ks, params = batch.ks, batch.params
        K = max(ks)
        logits, feat = self._sync(batch.seqs)
        base = self.cache.lengths[:len(batch)]
        u = torch.tensor([(draw(k) if not sp.greedy else [0.0] * k) + [0.0] * (K - k)
                          for draw, sp, k in zip(batch.draws, params, ks)])
        toks, qs = [], []
        for d in range(K):
            q = torch.stack([processed_probs(logits[b], sp) for b, sp in enumerate(params)])
            x = sample(q, u[:, d])
            toks.append(x)
            qs.append(q)
            if d < K - 1:
                lg, h = self._run(x[:, None], feat[:, None], chain_inputs([m + d for m in base], 1, self.device))
                logits, feat = lg[:, 0], h[:, 0]
        t, q_all = torch.stack(toks, 1).tolist(), torch.stack(qs, 1)
        return [Draft(t[b][:k], chain(k), None if params[b].greedy else q_all[b, :k]) if k else EMPTY
                for b, k in enumerate(ks)]


# ---------------------------------------------------------------------------------------------- checks


def pair_problems(heads: Path, target: ModelConfig, target_dir: Path | None = None) -> list[Problem]:
    """An EAGLE-3 head against its target: sizes, vocabulary, captured layers, and the tokenizer its training
    manifest recorded (a head trained by `trtspec train`)."""
    try:
        cfg = layouts.eagle3_config(heads, target)
    except ModelError as exc:
        return [Problem(KEY, str(heads), exc.message, exc.hint or "re-export the head")]
    out = [Problem(KEY, str(heads), d, "use an EAGLE-3 head trained on this target") for d in cfg.differences(target)]
    trained = manifest.read(Path(heads) / manifest.FILE_NAMES[manifest.TRAIN], manifest.TRAIN)
    want = ((trained or {}).get("inputs") or {}).get("target", {}).get("tokenizer_sha256")
    if want and target_dir is not None:
        have = tokenizer.fingerprint(target_dir)
        if have is not None and have != want:
            out.append(Problem(KEY, str(heads), "the head was trained on a target with another tokenizer "
                               f"({manifest.FILE_NAMES[manifest.TRAIN]}: tokenizer sha256 {want[:12]}..., "
                               f"the target's {have[:12]}...)", "use an EAGLE-3 head trained on this target"))
    return out


def weight_problems(heads: Path, target: ModelConfig) -> list[Problem]:
    """config.json vs the safetensors header: every tensor of the layout, with the shape the config gives."""
    try:
        cfg = layouts.eagle3_config(heads, target)
        shapes = weight_shapes(Path(heads))
    except ModelError as exc:
        return [Problem(KEY, str(heads), exc.message, exc.hint or "")]
    if shapes is None:
        return []
    c, H = cfg.layer, cfg.layer.hidden_size
    want = {"fc.weight": [H, 3 * cfg.target_hidden_size], "lm_head.weight": [cfg.draft_vocab_size, H],
            "d2t": [cfg.draft_vocab_size], "t2d": [c.vocab_size], "norm.weight": [H],
            "midlayer.self_attn.q_proj.weight": [c.q_size, 2 * H],
            "midlayer.self_attn.k_proj.weight": [c.kv_size, 2 * H],
            "midlayer.mlp.gate_proj.weight": [c.intermediate_size, H]}
    found = {k.removeprefix("model."): v for k, v in shapes.items()}
    for name in layouts.EAGLE3_TENSORS:
        if name not in found:
            return [Problem(KEY, str(heads), f"{layouts.EAGLE_WEIGHTS} has no tensor {name!r}",
                            "an EAGLE-3 head has " + ", ".join(layouts.EAGLE3_TENSORS))]
        file, got = found[name]
        if name in want and list(got) != want[name]:
            return [Problem(KEY, str(heads), f"{CONFIG} disagrees with the weights: {name} in {file} has shape "
                            f"{list(got)}, the config gives {want[name]}",
                            "point speculative.heads at the head its config describes")]
    return []

