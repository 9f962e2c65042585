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
#
# model.yaml reaches TensorRT-LLM as LLM(**yaml) -> update_llm_args_with_extra_dict, which turns speculative_config
# into a decoding config (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py). Two parsers were read there:
#   - the 1.x line: DecodingBaseConfig.from_dict, a table keyed by decoding_type: "MTP", "Medusa", "Eagle",
#     "Lookahead", "NGram", "DraftTarget", "UserProvided", "AUTO" (+ "SaveState" later), anything else a
#     ValueError "Invalid decoding type" (although DraftTargetDecodingConfig's own ClassVar says "Draft_Target");
#     the drafter field is `speculative_model_dir`; there is no "Eagle3" key: EAGLE-3 is "Eagle" with
#     eagle3_one_model. Read in two stored copies whose commit the search index did not give, dated by their
#     imports against the documentation builds nvidia.github.io/TensorRT-LLM/<version>/_modules/.../llm_args.html:
#     one between 1.0.0rc4 and 1.1.0rc5 (no eagle3_layers_to_capture, no draft_len_schedule), one between 1.1.0rc5
#     and 1.2.0rc2 (eagle3_layers_to_capture, no draft_len_schedule). Neither is the file at a release tag.
#   - main @ 0004396720054fd8e205cbf616f21f0b57c6b412: a pydantic union discriminated on decoding_type Literals
#     "Draft_Target", "Eagle3", "Eagle", "MTP", "NGram", "SA", "User_Provided", "SaveState", "PARD", "DFlash",
#     "DSpark", "AUTO" (no "DraftTarget"); the drafter field is `speculative_model`, with `speculative_model_dir`
#     kept as a validation alias (TensorRT-LLM PR #10099); DecodingBaseConfig declares draft_len_schedule. It also
#     keeps a private `_decoding_type_alias` "recorded during parsing": where and which other spellings main maps
#     onto these tags (its docs call "Eagle" an alias of "Eagle3") was not read; the probe shows it.
# Not verified: any 1.x release tag, and 1.2.x (26.03-26.07) at all. The 1.2.0rc2 documentation build of llm_args
# does not import pydantic's AliasChoices, which the alias needs, so trtspec spells 1.2 as the copies read before it.
# The probe (PROBE_SCRIPT, run inside the image: `trtspec repo llmapi-probe` prints the command) settles a
# container: it says which decoding_type / drafter-key pairs its TensorRT-LLM parses.
# tests/data/upstream/trtllm_llm_args.json records the field lists read; tests/trtllm/test_llmapi_keys.py checks
# every key trtspec writes against them.

MODEL_DIR, MODEL = "speculative_model_dir", "speculative_model"
_EAGLE_1X = (("decoding_type", "Eagle"), ("eagle3_one_model", True))


@dataclasses.dataclass(frozen=True)
class LlmapiSpelling:
    """How one TensorRT-LLM series reads model.yaml's speculative_config. Methods write the canonical form (the
    union's tags "Draft_Target", "Eagle3", "NGram", "SA"; the drafter as `speculative_model`); `apply` spells it
    for the series. `schedule` / `aux_layers`: whether its configs declare draft_len_schedule /
    eagle3_layers_to_capture (None: not known)."""
    series: str
    drafter_key: str                      # the field naming the drafter checkpoint
    draft_target: str                     # DraftTargetDecodingConfig's decoding_type
    eagle3: tuple[tuple[str, Any], ...]   # the keys that select EAGLE-3
    schedule: bool | None
    aux_layers: bool
    read: str                             # what the row rests on

    def apply(self, config: dict[str, Any]) -> dict[str, Any]:
        types = {"Draft_Target": {"decoding_type": self.draft_target}, "Eagle3": dict(self.eagle3)}
        out: dict[str, Any] = {}
        for key, value in config.items():
            if key == "decoding_type":
                out.update(types.get(value, {key: value}))
            else:
                out[self.drafter_key if key == MODEL else key] = value
        return out

    def model_key(self) -> str:
        return self.drafter_key

    @property
    def verified(self) -> bool:
        """Read from the source of the series' own line (never true of a 1.x row: see the comment above)."""
        return self.read.startswith("main @")


_R10 = "a pre-release 1.0 llm_args.py (between the 1.0.0rc4 and 1.1.0rc5 builds)"
_R11 = "a llm_args.py from between the 1.1.0rc5 and 1.2.0rc2 builds"
_R12 = "the 1.1 reading (no source of the 1.2 line was read; its 1.2.0rc2 build imports no AliasChoices)"
#                         series drafter key  Draft_Target   EAGLE-3    schedule aux layers read
LLMAPI_SPELLINGS: dict[str, LlmapiSpelling] = {r.series: r for r in (
    LlmapiSpelling("1.0", MODEL_DIR, "DraftTarget", _EAGLE_1X, False, False, _R10),
    LlmapiSpelling("1.1", MODEL_DIR, "DraftTarget", _EAGLE_1X, False, True, _R11),
    LlmapiSpelling("1.2", MODEL_DIR, "DraftTarget", _EAGLE_1X, None, True, _R12),
)}
# A later version (a custom image's; no NGC container ships one yet): main's union, as read.
CANONICAL = LlmapiSpelling("main", MODEL, "Draft_Target", (("decoding_type", "Eagle3"),), True, True,
                           "main @ 0004396720054fd8e205cbf616f21f0b57c6b412")


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


# Run inside the image (python3, stdlib + tensorrt_llm): which decoding_type / drafter-key pairs, and which
# optional keys, the container's TensorRT-LLM parses, through the path model.yaml takes
# (update_llm_args_with_extra_dict; where that leaves a dict, the union LlmArgs validates it with).
PROBE_SCRIPT = """\
import tensorrt_llm, tensorrt_llm.llmapi.llm_args as a
def parse(sc):
    out = a.update_llm_args_with_extra_dict({}, {"speculative_config": dict(sc)})["speculative_config"]
    if isinstance(out, dict):
        import pydantic
        out = pydantic.TypeAdapter(a.SpeculativeConfig).validate_python(out)
    where = getattr(out, "speculative_model", None) or getattr(out, "speculative_model_dir", None)
    return type(out).__name__ + ("" if where == "/tmp" else " (drafter dropped)")
cases = []
for tag, extra in (("DraftTarget", {}), ("Draft_Target", {}), ("Eagle", {"eagle3_one_model": True}), ("Eagle3", {})):
    for key in ("speculative_model_dir", "speculative_model"):
        cases.append((f"{tag} + {key}", {"decoding_type": tag, "max_draft_len": 4, key: "/tmp", **extra}))
        if tag.startswith("Draft"):
            cases.append((f"{tag} + {key} + draft_len_schedule",
                          {"decoding_type": tag, "max_draft_len": 4, key: "/tmp", "draft_len_schedule": {1: 4, 4: 2}}))
        else:
            cases.append((f"{tag} + {key} + eagle3_layers_to_capture",
                          {"decoding_type": tag, "max_draft_len": 4, key: "/tmp", **extra,
                           "eagle3_layers_to_capture": [0, 1, 3]}))
print("tensorrt_llm", tensorrt_llm.__version__)
for label, sc in cases:
    try:
        print(f"{label:56} parses: {parse(sc)}")
    except Exception as e:
        print(f"{label:56} refused: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:100]}")
"""


def probe_command() -> str:
    """The probe as one shell command, for `docker run <image> ...` or a shell inside the container."""
    import shlex

    return f"python3 -c {shlex.quote(PROBE_SCRIPT)}"
