"""The trtllm-engine runtime's method table: how TensorRT-LLM engines build and serve each method it maps
(trtllm-build flags, the converter's layout, the memory its heads take, the tensorrtllm backend's parameters).
The interface and its defaults are trtspec/builders/trtllm/method.py; a method without a row here (a plug-in,
routed) is refused with the interface's message, ngram and suffix with their own.

    draft-model   target: --use_paged_context_fmha enable --speculative_decoding_mode draft_tokens_external
                          --max_draft_len K;  draft: --use_paged_context_fmha enable [--gather_generation_logits
                          iff runtime.trtllm.use_draft_logits]; two tensorrtllm models, the BLS drives speculation
                          (orchestrator mode), fast logits with use_draft_logits
    medusa        --speculative_decoding_mode medusa (max_draft_len comes from the checkpoint: the tree's nodes,
                  or a chain as deep as the heads allow, at most K); MedusaForCausalLM; decoding_mode medusa,
                  medusa_choices, multi-block mode off
    eagle         --use_paged_context_fmha enable --speculative_decoding_mode eagle (max_batch_size <= 512);
                  max_seq_len grows by max_draft_len + num_eagle_layers; EagleForCausalLM (one EAGLE net per
                  tree level, no pipeline parallelism); decoding_mode eagle, eagle_choices, multi-block mode off
    lookahead     --speculative_decoding_mode lookahead_decoding --max_draft_len f(W, N, G); decoding_mode
                  lookahead, lookahead_window_size / _ngram_size / _verification_set_size
    none          a plain engine
    ngram, suffix refused: TensorRT-LLM engines have no prompt-lookup or suffix decoding

`engine_method(spec)` is the one lookup (the backend and the CLI call it and pass the row down).
"""

from __future__ import annotations

from pathlib import Path

from trtspec import methods
from trtspec.artifacts import heads as layouts
from trtspec.artifacts.hf import ModelConfig
from trtspec.builders.trtllm.memory import HeadSizes, kv_per_token, layer_params, per_rank_layer
from trtspec.builders.trtllm.method import DRAFT, TARGET, EngineMethod
from trtspec.convert import trtllm_heads as head_layouts
from trtspec.convert import params
from trtspec.convert.checkpoint import LLAMA, ConvertJob
from trtspec.errors import BuildError, ConvertError
from trtspec.methods import draft_model, eagle, lookahead, medusa, ngram, none, suffix
from trtspec.spec import Problem, Spec

EAGLE_MAX_BATCH = 512  # TensorRT-LLM's EAGLE engines


class DraftModelEngine(EngineMethod):
    mapped = True
    speculative_decoding_mode = "draft_tokens_external"
    draft_len_flag = True
    paged_context_fmha = True

    def engine_roles(self, spec: Spec) -> tuple[str, ...]:
        return (TARGET, DRAFT)

    def max_draft_len(self, spec: Spec) -> int:
        return spec.speculative.num_draft_tokens

    def build_flags(self, spec: Spec, role: str) -> list[str]:
        gather = role == DRAFT and spec.runtime.trtllm.use_draft_logits
        return super().build_flags(spec, role) + (["--gather_generation_logits"] if gather else [])

    def fast_logits(self, spec: Spec) -> bool:
        return spec.runtime.trtllm.use_draft_logits

    def convert_jobs(self, spec: Spec, out: Path, tp: int, pp: int) -> list[ConvertJob]:
        draft = ConvertJob(DRAFT, LLAMA, Path(spec.speculative.draft), None, out / DRAFT, tp, 1, spec.trtllm_dtype)
        return super().convert_jobs(spec, out, tp, pp) + [draft]  # the draft: the target's TP, no PP


def medusa_num_heads(spec: Spec) -> int:
    """The spec's Medusa heads count for the TensorRT-LLM paths (artifacts.heads' one reader, as a
    ConvertError: the converter's failure class; the memory plan lists it as a problem)."""
    if spec.speculative.heads is None:
        raise ConvertError(f"method '{medusa.NAME}' needs speculative.heads", hint="set speculative.heads in the spec")
    return layouts.medusa_num_heads(spec.speculative.heads, ConvertError)


class MedusaEngine(EngineMethod):
    mapped = True
    speculative_decoding_mode = "medusa"
    decoding_mode = "medusa"
    multi_block = False  # TensorRT-LLM's own runner turns it off for Medusa (unsupported there)

    def choices(self, spec: Spec) -> params.Choices:
        """The spec's tree, or a greedy chain as deep as the heads allow (at most num_draft_tokens)."""
        if spec.speculative.choices:
            return [list(c) for c in spec.speculative.choices]
        return params.chain(min(spec.speculative.num_draft_tokens, medusa_num_heads(spec)))

    def max_draft_len(self, spec: Spec) -> int:
        return len(self.choices(spec))

    def backend_parameters(self, spec: Spec, role: str) -> dict[str, str]:
        return {"medusa_choices": params.brace_choices(self.choices(spec))} if role == TARGET else {}

    def convert_jobs(self, spec: Spec, out: Path, tp: int, pp: int) -> list[ConvertJob]:
        return [ConvertJob(TARGET, head_layouts.MEDUSA, Path(spec.model.target), Path(spec.speculative.heads),
                           out / TARGET, tp, pp, spec.trtllm_dtype, max_draft_len=len(self.choices(spec)))]

    def memory_extras(self, spec: Spec, target: ModelConfig, tp: int, nbytes: int) -> HeadSizes:
        """N heads of L residual layers (H x H + bias) and an LM head each, on the target's last stage."""
        hcfg = layouts.medusa_config(spec.speculative.heads)
        n, nl, H, V = hcfg.num_heads, hcfg.num_layers, target.hidden_size, target.vocab_size
        vpad = -(-V // tp) * tp
        return HeadSizes(n * (nl * (H * H + H) + V * H), n * (nl * (H * H + H) / tp + vpad * H / tp), 0)


class EagleEngine(EngineMethod):
    mapped = True
    speculative_decoding_mode = "eagle"
    paged_context_fmha = True
    decoding_mode = "eagle"
    multi_block = False  # TensorRT-LLM's own runner turns it off for EAGLE (unsupported there)
    pipeline_parallel = False

    def choices(self, spec: Spec) -> params.Choices:
        """The spec's tree, or a greedy chain of num_draft_tokens."""
        if spec.speculative.choices:
            return [list(c) for c in spec.speculative.choices]
        return params.chain(spec.speculative.num_draft_tokens)

    def tree_params(self, spec: Spec) -> dict[str, int]:
        return params.eagle_tree_params(self.choices(spec))

    def max_draft_len(self, spec: Spec) -> int:
        return len(self.choices(spec))

    def extra_seq_len(self, spec: Spec) -> int:
        return self.max_draft_len(spec) + self.tree_params(spec)["num_eagle_layers"]

    def build_flags(self, spec: Spec, role: str) -> list[str]:
        if spec.limits.max_batch_size > EAGLE_MAX_BATCH:
            raise BuildError(f"EAGLE engines support max_batch_size <= {EAGLE_MAX_BATCH} "
                             f"(limits.max_batch_size = {spec.limits.max_batch_size})",
                             hint=f"set limits.max_batch_size <= {EAGLE_MAX_BATCH}")
        return super().build_flags(spec, role)

    def backend_parameters(self, spec: Spec, role: str) -> dict[str, str]:
        return {"eagle_choices": params.brace_choices(self.choices(spec))} if role == TARGET else {}

    def convert_jobs(self, spec: Spec, out: Path, tp: int, pp: int) -> list[ConvertJob]:
        return [ConvertJob(TARGET, head_layouts.EAGLE, Path(spec.model.target), Path(spec.speculative.heads),
                           out / TARGET, tp, pp, spec.trtllm_dtype, **self.tree_params(spec))]

    def memory_extras(self, spec: Spec, target: ModelConfig, tp: int, nbytes: int) -> HeadSizes:
        """One drafter (its layers, fc, embedding and LM head copies) per EAGLE net, with its KV cache."""
        ecfg = layouts.eagle_config(spec.speculative.heads, target)
        nets = self.tree_params(spec)["num_eagle_layers"]
        H, V, el = target.hidden_size, target.vocab_size, ecfg.num_layers
        vpad = -(-V // tp) * tp
        e_layer_total, _ = layer_params(ecfg)
        return HeadSizes(el * e_layer_total + 2 * H * H + H,
                         nets * (el * per_rank_layer(ecfg, tp) + (2 * H * H + H) / tp + V * H + vpad * H / tp),
                         kv_per_token(ecfg, el * nets, tp, nbytes))


class LookaheadEngine(EngineMethod):
    mapped = True
    speculative_decoding_mode = "lookahead_decoding"
    draft_len_flag = True
    decoding_mode = "lookahead"

    def engine_problems(self, spec: Spec, pp: int | None = None) -> list[Problem]:
        p = super().engine_problems(spec, pp)
        if (why := params.draft_len_excess(self.max_draft_len(spec))) is not None:
            p.append(Problem("speculative.lookahead", spec.speculative.lookahead.model_dump(), f"needs {why}",
                             "use a smaller window, ngram or verification_set"))
        return p

    def max_draft_len(self, spec: Spec) -> int:
        la = spec.speculative.lookahead
        return lookahead.lookahead_max_draft_len(la.window, la.ngram, la.verification_set)

    def backend_parameters(self, spec: Spec, role: str) -> dict[str, str]:
        la = spec.speculative.lookahead
        return {"lookahead_window_size": str(la.window), "lookahead_ngram_size": str(la.ngram),
                "lookahead_verification_set_size": str(la.verification_set)} if role == TARGET else {}


class PlainEngine(EngineMethod):
    mapped = True


class Refused(EngineMethod):
    """A method TensorRT-LLM engines cannot run, with why."""

    why: str = ""
    fix: str = ""

    def engine_problems(self, spec: Spec, pp: int | None = None) -> list[Problem]:
        return [Problem("speculative.method", self.name, self.why, self.fix)]


class NgramRefused(Refused):
    why = "TensorRT-LLM engines have no prompt-lookup mode"
    fix = "use runtime.kind = \"trtllm-llmapi\" (NGram) or \"torch\", or method lookahead"


class SuffixRefused(Refused):
    why = "TensorRT-LLM engines have no suffix decoding"
    fix = "use runtime.kind = \"torch\", or \"trtllm-llmapi\" with TensorRT-LLM >= 1.3 (SA)"


ENGINE_METHODS: dict[str, type[EngineMethod]] = {
    draft_model.NAME: DraftModelEngine, medusa.NAME: MedusaEngine, eagle.NAME: EagleEngine,
    lookahead.NAME: LookaheadEngine, ngram.NAME: NgramRefused, suffix.NAME: SuffixRefused,
    none.Plain.name: PlainEngine,
}


def engine_method(spec: Spec) -> EngineMethod:
    """The spec's method as the trtllm-engine runtime builds it: its row, or a refusal for a method the runtime
    does not map (a plug-in, routed)."""
    m = methods.get(spec.method)
    return ENGINE_METHODS.get(m.name, EngineMethod)(m.name, m.title)
