"""The trtllm-llmapi runtime's method table: the `LLM(...)` arguments each method it serves adds to model.yaml
(`speculative_config`, in the canonical spelling; `llm_args` spells it for the spec's TensorRT-LLM version,
trtllm_versions.py), the spec keys it drops without effect (`trtspec check` names them in a note), or why the LLM
API cannot serve it. A method without a row (a plug-in) is refused.

    draft-model   decoding_type Draft_Target, max_draft_len K, speculative_model <draft dir>; no overlap scheduler
    eagle         decoding_type Eagle3, max_draft_len K, speculative_model <heads dir>, eagle3_layers_to_capture
                  (EAGLE-3 heads only: the PyTorch backend runs EAGLE-3, not EAGLE-1/2); drops speculative.choices
    ngram         decoding_type NGram (prompt lookup): max_matching_ngram_size, is_keep_all, is_use_oldest,
                  is_public_pool; drops speculative.ngram.candidates (one chain, not a trie) and
                  min_matching (no shortest match)
    suffix        decoding_type SA (TensorRT-LLM's suffix automaton, documented from 1.3.0rc27; refused before);
                  cache_requests only switches the global pool; the other [speculative.suffix] knobs are dropped
    none          no speculative_config
    medusa, lookahead, routed   refused (the PyTorch backend has no Medusa or lookahead; one LLM takes one
                  speculative_config)

Every drafting row drops [speculative.adaptive] (the LLM API has no per-request adaptive K) and writes
speculative.schedule as draft_len_schedule where the version declares it (refused on 1.0/1.1).
`llmapi_method(spec)` is the one lookup; the backend passes `llm_args(spec)` to the repository.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

from trtspec import methods
from trtspec.artifacts import heads as layouts
from trtspec.artifacts.fs import read_json_object
from trtspec.artifacts.hf import CONFIG
from trtspec.backends.base import dropped_notes
from trtspec.backends.trtllm_engine_methods import ENGINE_METHODS
from trtspec.backends.trtllm_versions import DEFAULT_IMAGE, DEFAULT_VERSION, llmapi_spelling
from trtspec.builders.trtllm.method import EngineMethod
from trtspec.errors import RepositoryError
from trtspec.methods import draft_model, eagle, lookahead, medusa, ngram, none, routed, suffix
from trtspec.spec import Problem, Spec, draft_len_schedule

SA_SINCE = (1, 3, 0, 27)  # TensorRT-LLM's SADecodingConfig: first documented in 1.3.0rc27


class LlmapiMethod:
    """A method the LLM API does not serve (the defaults), and the interface of the rows that do."""

    refusal: ClassVar[str | None] = "trtspec maps it to no drafter of the TensorRT-LLM LLM API"
    # spec keys (dotted) the row drops without effect -> why; `notes` names the ones a spec writes
    dropped: ClassVar[dict[str, str]] = {}

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<trtllm-llmapi method {self.name}>"

    def fix(self) -> str:
        """The runtime that serves a refused method."""
        return "use runtime.kind = \"trtllm-engine\"" if ENGINE_METHODS.get(self.name, EngineMethod).mapped \
            else "use runtime.kind = \"torch\""

    def problems(self, spec: Spec) -> list[Problem]:
        """Why the LLM API cannot serve the spec (asked by spec validation for runtime trtllm-llmapi)."""
        if self.refusal is None:
            return self.schedule_problems(spec)
        served = [m.name for m in methods.registered() if m.drafts and llmapi_method_of(m.name).refusal is None]
        others = f", or method {_or_list(served)}" if served else ""
        return [Problem("speculative.method", self.name, self.refusal, self.fix() + others)]

    def notes(self, spec: Spec) -> list[str]:
        """What `trtspec check` says without failing: the dropped keys the spec writes, and that the version's
        spelling was not read at its tag."""
        out = dropped_notes(spec, "trtllm-llmapi", self.dropped)
        if self.refusal is None and methods.get(spec.method).drafts:
            v, row = spec.runtime.trtllm.version, llmapi_spelling(spec.runtime.trtllm.version)
            if not row.verified:
                out.append(f"TensorRT-LLM {v}'s speculative_config spelling (decoding_type {row.draft_target} / "
                           f"{dict(row.eagle3)['decoding_type']}, {row.drafter_key}) comes from {row.read}, not "
                           "from that release: settle it inside the image with `trtspec repo llmapi-probe` "
                           "(docs/llmapi.md)")
            if spec.speculative.schedule and row.schedule is None:
                out.append(f"whether TensorRT-LLM {v} declares draft_len_schedule (speculative.schedule) was not "
                           "verified: the same probe settles it")
        return out

    def schedule_problems(self, spec: Spec) -> list[Problem]:
        """speculative.schedule on a version whose speculative_config has no draft_len_schedule."""
        s, v = spec.speculative, spec.runtime.trtllm.version
        row = llmapi_spelling(v)
        if not s.schedule or row.schedule is not False:
            return []
        return [Problem("speculative.schedule", s.schedule, f"TensorRT-LLM {v}'s speculative_config declares no "
                        f"draft_len_schedule ({row.read} has none)", "remove speculative.schedule, or set "
                        f"version = \"{DEFAULT_VERSION}\" and image = \"{DEFAULT_IMAGE}\" (run the probe there: "
                        "docs/llmapi.md)")]

    def options(self, spec: Spec) -> dict[str, Any]:
        """The LLM(...) arguments the method adds to model.yaml (speculative_config, ...), canonically spelled."""
        if self.refusal is not None:
            raise RepositoryError(f"method {self.name!r} cannot be served by runtime 'trtllm-llmapi': "
                                  f"{self.refusal}", hint=self.fix())
        return {}


ADAPTIVE = {"speculative.adaptive": "the LLM API has no per-request adaptive K (speculative.schedule sets K by "
                                    "load, as draft_len_schedule)"}


class DraftModelLlmapi(LlmapiMethod):
    refusal = None
    dropped = ADAPTIVE

    def options(self, spec: Spec) -> dict[str, Any]:
        s = spec.speculative
        return {"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": s.num_draft_tokens,
                                       "speculative_model": str(Path(s.draft).resolve())},
                # "Two-model based speculation implementations do not support overlap scheduler."
                "disable_overlap_scheduler": True}


def eagle_version(heads_dir: Path) -> int:
    """3 for an EAGLE-3 head, 1 for an EAGLE-1/2 head (artifacts.heads.eagle_version; the LLM API's probe)."""
    return layouts.eagle_version(heads_dir, RepositoryError)


def eagle3_config(spec: Spec) -> dict[str, Any]:
    """The LLM API's speculative_config for an EAGLE-3 head: TensorRT-LLM captures the head's own layers
    (eagle3_layers_to_capture, layer outputs), not its default, when the head names them."""
    s = spec.speculative
    path = Path(s.heads) / CONFIG
    aux = layouts.eagle3_aux_layers(read_json_object(path, "EAGLE-3 head", RepositoryError), path, RepositoryError)
    return {"decoding_type": "Eagle3", "max_draft_len": s.num_draft_tokens,
            "speculative_model": str(Path(s.heads).resolve()),
            **({"eagle3_layers_to_capture": list(aux)} if aux else {})}


class EagleLlmapi(LlmapiMethod):
    refusal = None
    dropped = {**ADAPTIVE, "speculative.choices": "the PyTorch backend's EAGLE-3 drafts one chain of K (trtspec "
                                                  "writes no eagle_choices, a static tree upstream deprecates)"}

    def options(self, spec: Spec) -> dict[str, Any]:
        s, v = spec.speculative, spec.runtime.trtllm.version
        if eagle_version(Path(s.heads)) != 3:
            raise RepositoryError(
                f"{s.heads} is an EAGLE-1/2 head; the LLM API's PyTorch backend runs EAGLE-3 only "
                "(\"EAGLE (v1/v2) draft checkpoints are incompatible\")",
                hint="use runtime.kind = \"trtllm-engine\" for EAGLE-1 heads, or an EAGLE-3 head here")
        config = eagle3_config(spec)
        if "eagle3_layers_to_capture" in config and not llmapi_spelling(v).aux_layers:
            raise RepositoryError(
                f"{s.heads} captures the target's layers {config['eagle3_layers_to_capture']}, and TensorRT-LLM "
                f"{v}'s EagleDecodingConfig declares no eagle3_layers_to_capture (it would capture its default "
                "layers, which the head was not trained on)",
                hint=f"set version = \"{DEFAULT_VERSION}\" and image = \"{DEFAULT_IMAGE}\"")
        return {"speculative_config": config}


def ngram_config(spec: Spec) -> dict[str, Any]:
    """The LLM API's n-gram (prompt lookup) drafter: K draft tokens, matching up to max_matching tokens
    (TensorRT-LLM's NGramDecodingConfig: max_matching_ngram_size, is_keep_all, is_use_oldest, is_public_pool)."""
    return {"decoding_type": "NGram", "max_draft_len": spec.speculative.num_draft_tokens,
            "max_matching_ngram_size": spec.speculative.ngram.max_matching, "is_keep_all": True,
            "is_use_oldest": True, "is_public_pool": True}


class NgramLlmapi(LlmapiMethod):
    refusal = None
    dropped = {**ADAPTIVE, "speculative.ngram.candidates": "the LLM API's NGram drafter proposes one chain, not a "
                                                           "trie of candidate continuations",
               "speculative.ngram.min_matching": "the LLM API's NGram drafter has no shortest match (it matches "
                                                 "down to one token)"}

    def options(self, spec: Spec) -> dict[str, Any]:
        return {"speculative_config": ngram_config(spec)}


def _version(text: str) -> tuple[float, ...]:
    """"1.2.1" -> (1, 2, 1, inf), "1.3.0rc27" -> (1, 3, 0, 27): a release sorts after its release candidates."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?(?:rc(\d+))?", text.strip())
    if m is None:
        return (0, 0, 0, 0)
    major, minor, patch, rc = m.groups()
    return (int(major), int(minor), int(patch or 0), float(rc) if rc else float("inf"))


class SuffixLlmapi(LlmapiMethod):
    refusal = None  # by version: problems
    dropped = {**ADAPTIVE, **{f"speculative.suffix.{k}": "TensorRT-LLM's SA matches the longest suffix and has no "
                              "such knob" for k in ("max_depth", "max_spec_factor", "max_spec_offset",
                                                   "min_token_prob", "cache_tokens")}}

    def problems(self, spec: Spec) -> list[Problem]:
        v = spec.runtime.trtllm.version
        if _version(v) >= SA_SINCE:
            return self.schedule_problems(spec)
        return [Problem("runtime.trtllm.version", v, f"TensorRT-LLM {v} has no SA (suffix automaton) decoding "
                        "for the LLM API: SADecodingConfig first appears in 1.3.0rc27",
                        "use runtime.kind = \"torch\", a TensorRT-LLM >= 1.3 container, or method ngram")]

    def options(self, spec: Spec) -> dict[str, Any]:
        if (p := self.problems(spec)):
            raise RepositoryError(f"method '{self.name}' cannot be served by runtime 'trtllm-llmapi': {p[0].message}",
                                  hint=p[0].hint)
        s = spec.speculative.suffix
        return {"speculative_config": {"decoding_type": "SA", "max_draft_len": spec.speculative.num_draft_tokens,
                                       "max_matching_ngram_size": -1, "enable_global_pool": s.cache_requests > 0}}


class PlainLlmapi(LlmapiMethod):
    refusal = None


class MedusaRefused(LlmapiMethod):
    refusal = ("the TensorRT-LLM LLM API (PyTorch backend) does not support Medusa: MedusaDecodingConfig "
               "supports the TensorRT engine backend only")


class LookaheadRefused(LlmapiMethod):
    refusal = ("TensorRT-LLM's LookaheadDecodingConfig runs on TensorRT engines only, not the LLM API's "
               "PyTorch backend")


class RoutedRefused(LlmapiMethod):
    refusal = "one LLM takes one speculative_config: several drafters per request are trtspec's torch runtime"


LLMAPI_METHODS: dict[str, type[LlmapiMethod]] = {
    draft_model.NAME: DraftModelLlmapi, medusa.NAME: MedusaRefused, eagle.NAME: EagleLlmapi,
    lookahead.NAME: LookaheadRefused, ngram.NAME: NgramLlmapi, suffix.NAME: SuffixLlmapi,
    none.Plain.name: PlainLlmapi, routed.NAME: RoutedRefused,
}


def llmapi_method_of(name: str) -> LlmapiMethod:
    return LLMAPI_METHODS.get(name, LlmapiMethod)(name)


def llmapi_method(spec: Spec) -> LlmapiMethod:
    """The spec's method as the trtllm-llmapi runtime serves it (its row, or a refusal)."""
    return llmapi_method_of(methods.get(spec.method).name)


def llm_args(spec: Spec) -> dict[str, Any]:
    """The method's LLM(...) arguments for the spec, speculative_config spelled for its TensorRT-LLM version, with
    speculative.schedule as draft_len_schedule (floored at 1: trtspec.spec.draft_len_schedule)."""
    args = llmapi_method(spec).options(spec)
    if args.get("speculative_config"):
        sc = dict(args["speculative_config"])
        if (schedule := draft_len_schedule(spec)):
            for p in llmapi_method(spec).schedule_problems(spec):  # (spec validation refuses it first)
                raise RepositoryError(f"{p.key}: {p.message}", hint=p.hint)
            sc["draft_len_schedule"] = schedule
        args["speculative_config"] = llmapi_spelling(spec.runtime.trtllm.version).apply(sc)
    return args


def speculative_config(spec: Spec) -> dict[str, Any] | None:
    """The method's speculative_config (None: plain decoding), spelled for the spec's TensorRT-LLM version; a
    method the LLM API cannot serve is a RepositoryError saying why."""
    return llm_args(spec).get("speculative_config")


def _or_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"
