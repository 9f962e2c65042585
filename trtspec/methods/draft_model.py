"""draft-model: an independent small LM (same tokenizer) proposes a chain sampled from its processed distribution q.

    torch          DraftModelProposer: the draft's own KV cache, rolled back to what the target accepted
    runtimes       what the TensorRT-LLM runtimes make of it is their method tables' (docs/architecture.md)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.artifacts import tokenizer
from trtspec.artifacts.hf import CONFIG, ModelConfig, summary
from trtspec.artifacts.pair import llama_weight_problems
from trtspec.methods.base import Method
from trtspec.runtime.proposer import EMPTY, Draft, DraftPlan, ProposalBatch, Proposer, chain
from trtspec.spec import Problem, Spec

if TYPE_CHECKING:
    import torch

    from trtspec.runtime.llama import Llama

NAME = "draft-model"
CATCH_UP = 8  # in a batch, a row with a backlog of this many tokens or more catches up in a pass of its own


class DraftModelProposer(Proposer):
    """A small LM with its own KV cache, kept in sync with what the target accepted.

    The draft cache holds a prefix of the row's sequence; each propose first feeds what it has not seen
    (the pending token, plus the last accepted draft when all were accepted) and then samples K tokens, feeding
    each of the first K-1 back. Afterwards its length is set to the part of what it fed that was accepted.
    """

    name = NAME

    def __init__(self, path: str | Path, dtype: str = "float32", device: str = "cpu",
                 weight_dtype: torch.dtype | None = None, quantization: str | None = None):
        """`quantization`: the drafter's weight-only quantization (speculative.draft_quantization), done as it
        loads (the engine's quantize_proposer then finds it done)."""
        self.path, self.dtype, self.device, self.weight_dtype = Path(path), dtype, device, weight_dtype
        self.quantization = quantization

    def setup(self, target: Llama, max_batch: int, max_seq: int, k: int) -> DraftPlan:
        from trtspec.runtime.llama import draft_dtype
        from trtspec.runtime.loaded import load_model, new_cache

        wdt = self.weight_dtype or draft_dtype(self.dtype, self.device, 4 * ModelConfig.from_dir(self.path).num_params)
        self.model = load_model(self.path, dtype=self.dtype, device=self.device, max_seq=max_seq, name="draft",
                                weight_dtype=wdt, quantization=self.quantization)
        self.cache = new_cache(self.model, max_batch, max_seq)
        self.vocab = target.cfg.vocab_size
        self._fed: list[tuple[int, int]] = []
        return DraftPlan.chain(k)

    def admit(self, row: int, hidden: torch.Tensor) -> None:
        self.cache.lengths[row] = 0

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)

    def lag(self, row: int, length: int) -> int:
        return max(0, length - 1 - self.cache.lengths[row])

    def _logits(self, lg: torch.Tensor) -> torch.Tensor:
        """The draft's logits over the target's vocabulary (a larger draft vocab is cut, a smaller one padded)."""
        import torch.nn.functional as F

        V = lg.shape[-1]
        if V > self.vocab:
            return lg[..., : self.vocab]
        if V < self.vocab:
            return F.pad(lg, (0, self.vocab - V), value=float("-inf"))
        return lg

    def propose(self, batch: ProposalBatch) -> list[Draft]:
        import torch

        from trtspec.runtime.cache import chain_inputs
        from trtspec.runtime.sampling import processed_probs, sample

        ks, seqs, params = batch.ks, batch.seqs, batch.params
        K, B = max(ks), len(batch)
        if K == 0:
            self._fed = []
            return [EMPTY] * B
        if B > 1:
            self._catch_up(seqs)
        lengths = self.cache.lengths[:B]
        feeds = [s[n:] for s, n in zip(seqs, lengths)]
        T = max(len(f) for f in feeds)
        tokens = torch.tensor([f + [0] * (T - len(f)) for f in feeds], device=self.device)
        inp = chain_inputs(lengths, T, self.device)
        last = torch.tensor([[len(f) - 1] for f in feeds], device=self.device)
        lg, _ = self.model.forward(self.cache, inp.positions, inp.start, inp.mask, tokens=tokens, logits_at=last)
        greedy = all(sp.greedy for sp in params)
        # each sampling row draws exactly its own k uniforms: its random stream does not depend on the batch
        u = None if greedy else torch.tensor([(draw(k) if not sp.greedy else [0.0] * k) + [0.0] * (K - k)
                                              for draw, sp, k in zip(batch.draws, params, ks)])
        n = [len(s) for s in seqs]
        drafted, qs = [], []
        for i in range(K):
            lg = self._logits(lg[:, -1])
            if greedy:
                x = lg.argmax(-1)
            else:
                q = torch.stack([processed_probs(lg[b], sp) for b, sp in enumerate(params)])
                x = sample(q, u[:, i])
                qs.append(q)
            drafted.append(x)
            if i < K - 1:
                inp = chain_inputs([m + i for m in n], 1, self.device)
                lg, _ = self.model.forward(self.cache, inp.positions, inp.start, inp.mask, tokens=x[:, None])
        self._fed = [(m, m + K - 1) for m in n]  # (sequence length before the step, what the cache holds)
        toks = torch.stack(drafted, 1).tolist()
        q_all = torch.stack(qs, 1) if qs else None
        return [Draft(toks[b][:k], chain(k), None if q_all is None or params[b].greedy else q_all[b, :k])
                if k else EMPTY for b, k in enumerate(ks)]

    def _catch_up(self, seqs: list[list[int]]) -> None:
        """Feed each row's long backlog (a new prompt, or the tokens of steps that drafted nothing) but its last
        token in a pass of that row alone: in the batch's pass every row is padded to the longest feed, and B rows x
        a prompt's length cost B prefills (measured: the W4A8 pair at 4 concurrent requests ran at 0.55x of plain
        decoding)."""
        import torch

        from trtspec.runtime.cache import chain_inputs

        for b, seq in enumerate(seqs):
            n = self.cache.lengths[b]
            if len(seq) - n - 1 < CATCH_UP:
                continue
            todo = seq[n:-1]
            inp = chain_inputs([n], len(todo), self.device)
            self.model.forward(self.cache, inp.positions, inp.start, inp.mask, row0=b, logits=False,
                               tokens=torch.tensor([todo], device=self.device))
            self.cache.lengths[b] = n + len(todo)

    def commit(self, paths: list[list[int]], hidden: torch.Tensor) -> None:
        fed, self._fed = self._fed, []  # this step's only: after a move_row it would describe another request
        for b, ((before, n), path) in enumerate(zip(fed, paths)):
            # keep what was fed up to the first fed token that is not in the sequence: before + accepted drafts
            self.cache.lengths[b] = min(n, before + len(path))


class DraftModel(Method):
    name = NAME
    title = "draft-model"
    weights = "draft"

    def drafter(self, spec: Spec) -> dict[str, Any] | None:
        return None if spec.speculative.draft is None else summary(ModelConfig.from_dir(spec.speculative.draft).raw)

    def pair_problems(self, spec: Spec, target: ModelConfig) -> list[Problem]:
        """Same vocabulary and tokenizer as the target, positions for the longest sequence."""
        draft = spec.speculative.draft
        if draft is None:
            return []
        dcfg, p = ModelConfig.from_dir(draft), []
        if dcfg.vocab_size != target.vocab_size:
            p.append(Problem("speculative.draft", str(draft),
                             f"vocab_size {dcfg.vocab_size} differs from the target's {target.vocab_size}",
                             "use a draft trained with the target's tokenizer"))
        d_fp, t_fp = tokenizer.fingerprint(draft), tokenizer.fingerprint(spec.tokenizer_dir)
        if d_fp is not None and t_fp is not None and d_fp != t_fp:
            why = tokenizer.difference(Path(draft), Path(spec.tokenizer_dir))
            p.append(Problem("speculative.draft", str(draft), "its tokenizer differs from the target's"
                             + (f": {why}" if why else ""),
                             "draft and target must share one tokenizer (same vocab, merges and special tokens)"))
        d_eos, t_eos = set(dcfg.eos_token_ids), set(target.eos_token_ids)
        if d_eos and t_eos and d_eos != t_eos:
            p.append(Problem("speculative.draft", str(draft),
                             f"its EOS token ids {sorted(d_eos)} differ from the target's {sorted(t_eos)}",
                             "a drafter of the target's family ends text with the target's EOS; use one (or set "
                             "eos_token_id in its config.json and generation_config.json to the target's)"))
        need = spec.limits.max_seq_len + spec.speculative.num_draft_tokens
        if need > dcfg.max_position_embeddings:
            p.append(Problem("speculative.draft", str(draft),
                             f"draft max_position_embeddings ({dcfg.max_position_embeddings}) < the sequence "
                             f"length needed ({need})", "lower the limits or use a draft with longer positions"))
        return p

    def weight_problems(self, spec: Spec, target: ModelConfig) -> list[Problem]:
        draft = spec.speculative.draft
        if draft is None or not (Path(draft) / CONFIG).is_file():
            return []
        return llama_weight_problems("speculative.draft", Path(draft), ModelConfig.from_dir(draft))

    def proposer(self, spec: Spec, device: str) -> Proposer:
        return DraftModelProposer(spec.speculative.draft, dtype=spec.model.dtype, device=device,
                                  quantization=spec.speculative.draft_quantization)
