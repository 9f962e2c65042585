"""Which TensorRT-LLM each Triton TensorRT-LLM container ships, and what that TensorRT-LLM accepts: the one table
trtspec's defaults, `check`, `build` and `serve` agree with.

Engines only deserialize in the TensorRT-LLM (and TensorRT) that built them, so a spec whose
`runtime.trtllm.image` ships another TensorRT-LLM than `runtime.trtllm.version` is refused before anything is
built or served (the most reported TensorRT-LLM deployment failure). The rows are NVIDIA's compatibility matrix,
triton-inference-server/server `docs/introduction/compatibility.md` (branch r26.08, last change 6fa22ae028e6,
2026-08-20), section "Container Name: trtllm-python-py3". The public build recipe (tensorrtllm_backend
`dockerfile/Dockerfile.triton.trt_llm_backend`, `ARG TENSORRTLLM_VER`) pins the same versions except for 25.11
(recipe: 1.2.0rc2) and 26.03 (recipe: 1.2.0rc8); the table is what the NGC images ship, so it wins. The newest
trtllm row is 26.07: whether a 26.08 trtllm image exists was not verified, so later tags are refused as unknown.

The LLM API's `speculative_config` spelling differs between TensorRT-LLM versions; `LLMAPI_SPELLINGS` keeps the
choice in one place, keyed by TensorRT-LLM minor version (see its comment for what was and was not verified).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

COMPAT_SOURCE = ("triton-inference-server/server docs/introduction/compatibility.md @ r26.08 (6fa22ae028e6), "
                 "'Container Name: trtllm-python-py3'")
NGC_REPO = "nvcr.io/nvidia/tritonserver"
FLAVOUR = "trtllm-python-py3"


@dataclasses.dataclass(frozen=True)
class Release:
    """One Triton release's TensorRT-LLM container."""
    triton: str           # "26.07"
    trtllm: str           # TensorRT-LLM version it ships
    tensorrt: str
    cuda: str
    torch: str

    @property
    def image(self) -> str:
        return f"{NGC_REPO}:{self.triton}-{FLAVOUR}"


_T25 = "2.9.0a0+145a3a7bda.nv25.10"
_T26 = "2.10.0a0+b4e4ee81d3.nv25.12"
# Oldest first; every row from COMPAT_SOURCE.
RELEASES: tuple[Release, ...] = (
    Release("25.10", "1.0.0", "10.11.0.33", "12.9.1", "2.8.0a0+5228986c39.nv25.6"),
    Release("25.11", "1.0.3.2510", "10.13.3.9", "13.0.2", _T25),
    Release("25.12", "1.1.0", "10.13.3.9", "13.0.2", _T25),
    Release("26.01", "1.1.0", "10.13.3.9", "13.0.2", _T25),
    Release("26.02", "1.1.0", "10.13.3.9", "13.0.2", _T25),
    Release("26.03", "1.2.0", "10.14.1.48", "13.1.0", _T26),
    Release("26.04", "1.2.1", "10.14.1.48", "13.1.0", _T26),
    Release("26.05", "1.2.1", "10.14.1.48", "13.1.0", _T26),
    Release("26.06", "1.2.1", "10.14.1.48", "13.1.0", _T26),
    Release("26.07", "1.2.1", "10.14.1.48", "13.1.0", _T26),
)
BY_TRITON = {r.triton: r for r in RELEASES}

DEFAULT_VERSION = "1.2.1"
# The newest container of the default version (trtspec.spec's default image; a test keeps them equal).
DEFAULT_IMAGE = [r for r in RELEASES if r.trtllm == DEFAULT_VERSION][-1].image

# trtllm-engine is legacy: TensorRT-LLM main has no engines, no trtllm-build and no C++ Triton backend any more,
# and the two-model draft path is deprecated (TensorRT-LLM PR #17562). trtspec's engine path is pinned to the
# last series that has them and that it was checked against.
ENGINE_SERIES = "1.2"
LEGACY_NOTE = ("trtllm-engine is a legacy runtime, pinned to TensorRT-LLM 1.2.x containers (26.03-26.07): "
               "TensorRT-LLM main has no engines, trtllm-build or C++ Triton backend any more and the two-model "
               "draft path is deprecated (PR #17562); trtllm-llmapi is the recommended TensorRT-LLM runtime")


def series(version: str) -> str:
    """'1.2' of '1.2.1' (the minor series keys what a version accepts)."""
    return ".".join(str(version).strip().removeprefix("v").split(".")[:2])


def known_versions() -> list[str]:
    return list(dict.fromkeys(r.trtllm for r in RELEASES))


def releases_of(version: str) -> list[Release]:
    return [r for r in RELEASES if r.trtllm == version]


def image_release(image: str) -> str | None:
    """The Triton release ("26.07") of an NGC Triton TensorRT-LLM image tag; None for any other image (a
    custom image, e.g. one built FROM it, cannot be checked from its name)."""
    m = re.fullmatch(rf"(?:{re.escape(NGC_REPO)}|tritonserver):(\d\d\.\d\d)-{FLAVOUR}", image.strip())
    return m.group(1) if m else None


def image_problems(version: str, image: str, *, custom_versions: bool = False) -> list[tuple[str, str, str]]:
    """(key, message, fix) for a version/image pair that disagrees with the table ([] when it agrees, or when
    the image is not an NGC tag: see `image_note`). `custom_versions`: a version no NGC container ships is
    taken in a custom image (the LLM API of a newer TensorRT-LLM installed into one; engines never are)."""
    newest = [r for r in RELEASES if r.trtllm == version]
    release = image_release(image)
    if not newest and not (custom_versions and release is None):
        ships = f" ({image} ships {BY_TRITON[release].trtllm})" if release in BY_TRITON else ""
        return [("runtime.trtllm.version", f"no Triton TensorRT-LLM container ships TensorRT-LLM {version}{ships} "
                 f"(known: {', '.join(known_versions())}; {COMPAT_SOURCE})",
                 f"set version = \"{DEFAULT_VERSION}\" and image = \"{DEFAULT_IMAGE}\"" +
                 (", or name the custom image that has it" if custom_versions else ""))]
    if release is None:
        return []
    row = BY_TRITON.get(release)
    if row is None:
        fit = newest[-1] if newest else BY_TRITON[DEFAULT_IMAGE.split(":")[1][:5]]
        return [("runtime.trtllm.image", f"Triton {release} is not in trtspec's container table (25.10-26.07), "
                 "so its TensorRT-LLM version is unknown", f"use image = \"{fit.image}\" (TensorRT-LLM {fit.trtllm})")]
    if row.trtllm != version:
        return [("runtime.trtllm.image", f"ships TensorRT-LLM {row.trtllm}, not runtime.trtllm.version {version}: "
                 "engines built by one fail to deserialize in the other",
                 f"use image = \"{newest[-1].image}\", or version = \"{row.trtllm}\"")]
    return []


def image_note(version: str, image: str) -> str | None:
    """What `trtspec check` says about an image it cannot check (not an NGC Triton TensorRT-LLM tag)."""
    if image_release(image) is None:
        return (f"runtime.trtllm.image {image} is not an NGC Triton TensorRT-LLM tag: trtspec cannot check that "
                f"it ships TensorRT-LLM {version} (build it FROM one of: "
                f"{', '.join(r.image for r in releases_of(version)) or DEFAULT_IMAGE})")
    return None


# ------------------------------------------------------------------------------------ LLM API spelling


@dataclasses.dataclass(frozen=True)
class LlmapiSpelling:
    """How one TensorRT-LLM series spells `speculative_config` in model.yaml (LLM(**yaml) ->
    update_llm_args_with_extra_dict -> DecodingBaseConfig.from_dict). Methods write the canonical form, the
    config classes' own names (decoding_type "Draft_Target", "Eagle3", "NGram"; the drafter dir as
    `speculative_model`); `apply` turns it into this series' spelling."""
    decoding_types: dict[str, dict[str, Any]]   # canonical decoding_type -> the keys that replace it
    keys: dict[str, str]                        # canonical key -> this series' key

    def apply(self, config: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in config.items():
            if key == "decoding_type":
                out.update(self.decoding_types.get(value, {key: value}))
            else:
                out[self.keys.get(key, key)] = value
        return out

    def model_key(self) -> str:
        return self.keys.get("speculative_model", "speculative_model")


# NOT verified at tag v1.2.1: TensorRT-LLM's llm_args.py at that tag could not be read (the repository is too
# big to fetch; the search index holds other versions, and the Triton image's TensorRT-LLM comes from the fork
# triton-inference-server/TensorRT-LLM at 2fdb9e66/ca88df0a). What was read (/work/shared-notes/research.md A5):
#   - the 1.1/1.2-era llm_args.py (index id 1090804222): DecodingBaseConfig.from_dict accepts only "MTP",
#     "Medusa", "Eagle", "Lookahead", "NGram", "DraftTarget", "SaveState", "UserProvided", "AUTO" (else
#     ValueError "Invalid decoding type"), although DraftTargetDecodingConfig's ClassVar says "Draft_Target";
#     the drafter's field is `speculative_model_dir`; no "Eagle3" key: EAGLE-3 is decoding_type "Eagle" with
#     eagle3_one_model; NGram max_matching_ngram_size defaults to 0 (methods always write it);
#   - a pre-1.3 main (index id 7019226376): a pydantic union on Literals "Draft_Target", "Eagle", "Eagle3", ...,
#     `speculative_model` with the alias `speculative_model_dir` (TensorRT-LLM PR #10099), ngram default 2.
# So for 1.0-1.2 trtspec writes the forms the 1.1/1.2-era parser takes: "DraftTarget", "Eagle" +
# eagle3_one_model, "NGram", speculative_model_dir (accepted by both versions read). Probe a container with:
#   python3 -c "from tensorrt_llm.llmapi.llm_args import update_llm_args_with_extra_dict as u; print(u({},
#     {'speculative_config': {'decoding_type': 'DraftTarget', 'max_draft_len': 4, 'speculative_model_dir': '/x'}}))"
_SPELLING_1X = LlmapiSpelling({"Draft_Target": {"decoding_type": "DraftTarget"},
                               "Eagle3": {"decoding_type": "Eagle", "eagle3_one_model": True}},
                              {"speculative_model": "speculative_model_dir"})
LLMAPI_SPELLINGS: dict[str, LlmapiSpelling] = {"1.0": _SPELLING_1X, "1.1": _SPELLING_1X, "1.2": _SPELLING_1X}
# Later versions (a custom image's; no NGC container ships one yet): the canonical form, the pydantic union of
# the pre-1.3 main read (index id 7019226376: Literals "Draft_Target", "Eagle3", field speculative_model).
CANONICAL = LlmapiSpelling({}, {})


def _key(s: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in s.split("."))


def llmapi_spelling(version: str) -> LlmapiSpelling:
    """The spelling for TensorRT-LLM `version`: its series' row; a later series: CANONICAL; an earlier one:
    the oldest row."""
    s = series(version)
    if s in LLMAPI_SPELLINGS:
        return LLMAPI_SPELLINGS[s]
    known = sorted(LLMAPI_SPELLINGS, key=_key)
    return CANONICAL if _key(s) > _key(known[-1]) else LLMAPI_SPELLINGS[known[0]]
