"""Every key the trtllm-llmapi repository writes into model.yaml, for each method and TensorRT-LLM series, is a
field of TensorRT-LLM's LLM-API classes as recorded from upstream (tests/data/upstream/trtllm_llm_args.json, which
names what was read: NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py copies and a commit of main), and the
probe that settles a container reports what its TensorRT-LLM parses."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import ROOT
from tests.trtllm import fixtures as fx
from tests.trtllm.conftest import METHOD_BODIES, spec_text

UPSTREAM = json.loads((ROOT / "tests" / "data" / "upstream" / "trtllm_llm_args.json").read_text())
# (version, image) per series: the NGC containers' own pairs; a later version comes in a custom image
VERSIONS = {"1.0": ("1.0.0", "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3"),
            "1.1": ("1.1.0", "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"),
            "1.2": ("1.2.1", "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"),
            "main": ("1.3.0rc27", "registry.example/trtllm:1.3.0rc27")}
SUFFIX = '[speculative]\nmethod = "suffix"\nnum_draft_tokens = 4\n[speculative.suffix]\ncache_requests = 8\n'
SCHEDULE = "schedule = {1 = 4, 2 = 2}\n"


def recorded(series: str) -> dict:
    row = UPSTREAM["series"][series]
    return recorded(row["same_as"]) if "same_as" in row else row


def unknown_keys(data: dict, series: str) -> list[str]:
    """The keys of a model.yaml that the recorded classes of `series` do not declare, and a decoding_type its
    parser does not take ([] when every key is declared). triton_config is model.py's: it drops it before LLM()."""
    row = recorded(series)

    def fields(name: str) -> set[str]:
        return set(row["classes"][name]["fields"])

    out = [k for k in data if k != "triton_config" and k not in fields("BaseLlmArgs") | fields("TorchLlmArgs")]
    out += [f"kv_cache_config.{k}" for k in data.get("kv_cache_config") or {} if k not in fields("KvCacheConfig")]
    sc = data.get("speculative_config")
    if sc:
        cls = row["parser"]["types"].get(sc.get("decoding_type"))
        if cls is None:
            return out + [f"speculative_config.decoding_type = {sc.get('decoding_type')!r}"]
        allowed = fields("DecodingBaseConfig") | fields(cls) | set(row["aliases"]) | {"decoding_type"}
        out += [f"speculative_config.{k}" for k in sc if k not in allowed]
    return out


def _eagle3_head(workdir: Path, aux: list[int] | None) -> None:
    cfg = json.loads((workdir / "eagle" / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]
    cfg.pop("eagle_config", None)
    if aux is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux}
    (workdir / "eagle" / "config.json").write_text(json.dumps(cfg))


def _spec(workdir: Path, series: str, body: str, name: str):
    from trtspec.check import load_spec

    version, image = VERSIONS[series]
    text = spec_text("none", name=name, kind="trtllm-llmapi", trtllm=f'version = "{version}"\nimage = "{image}"\n')
    return load_spec(fx.write_spec(workdir / f"{name}.toml", text.replace(METHOD_BODIES["none"], body)))


def _model_yaml(spec, repo: Path) -> dict:
    from trtspec.backends.trtllm_llmapi_methods import llm_args
    from trtspec.repository.trtllm.llmapi import render_llmapi_repository

    return yaml.safe_load(render_llmapi_repository(spec, llm_args(spec), repo)["tensorrt_llm/1/model.yaml"])


@pytest.mark.parametrize("series", list(VERSIONS))
def test_every_key_model_yaml_holds_is_a_field_the_version_declares(series, workdir):
    """draft-model (with a schedule unless the version is known to lack one), eagle (an EAGLE-3 head, with and
    without captured layers), ngram, suffix (from 1.3.0rc27) and none: every key, and the class decoding_type
    selects."""
    from trtspec.backends.trtllm_versions import llmapi_spelling

    row = llmapi_spelling(VERSIONS[series][0])
    schedule = SCHEDULE if row.schedule is not False else ""
    # 1.2's draft_len_schedule: written, not verified (no 1.2 source was read; `check` notes it, the probe settles it)
    unverified = {"speculative_config.draft_len_schedule"} if row.schedule is None else set()
    bodies = {"draft-model": METHOD_BODIES["draft-model"] + schedule, "ngram": METHOD_BODIES["ngram"],
              "none": METHOD_BODIES["none"], "eagle": METHOD_BODIES["eagle"]}
    if series == "main":
        bodies["suffix"] = SUFFIX
    heads = [None, [0, 1, 2]] if row.aux_layers else [None]
    types = recorded(series)["parser"]["types"]
    seen = {}
    for method, body in bodies.items():
        for aux in heads if method == "eagle" else [None]:
            _eagle3_head(workdir, aux)
            data = _model_yaml(_spec(workdir, series, body, f"{method}-{aux is not None}"), workdir / "repo")
            assert set(unknown_keys(data, series)) == (unverified if SCHEDULE in body else set()), (series, data)
            sc = data.get("speculative_config") or {}
            seen[method] = types.get(sc.get("decoding_type"))
            if aux:
                assert sc["eagle3_layers_to_capture"] == aux
    assert seen == {"draft-model": "DraftTargetDecodingConfig", "ngram": "NGramDecodingConfig", "none": None,
                    "eagle": "Eagle3DecodingConfig" if series == "main" else "EagleDecodingConfig",
                    **({"suffix": "SADecodingConfig"} if series == "main" else {})}


def test_the_key_check_names_a_wrong_key():
    """The check above fails on what a wrong spelling would write (it is not a check that cannot fail)."""
    dm = {"model": "m", "speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 4,
                                              "speculative_model_dir": "d"}}
    assert unknown_keys(dm, "1.1") == []
    assert unknown_keys({**dm, "max_draft_tokens": 4}, "1.1") == ["max_draft_tokens"]
    renamed = {"decoding_type": "DraftTarget", "max_draft_len": 4, "speculative_model": "d"}
    assert unknown_keys({"speculative_config": renamed}, "1.2") == ["speculative_config.speculative_model"]
    assert unknown_keys({"speculative_config": dm["speculative_config"]}, "main") == [
        "speculative_config.decoding_type = 'DraftTarget'"]  # main's union has no DraftTarget tag
    eagle = {"decoding_type": "Eagle", "max_draft_len": 4, "speculative_model_dir": "h",
             "eagle3_layers_to_capture": [0]}
    assert unknown_keys({"speculative_config": eagle}, "1.0") == ["speculative_config.eagle3_layers_to_capture"]
    assert unknown_keys({"kv_cache_config": {"free_gpu_mem_fraction": 0.9}}, "main") == [
        "kv_cache_config.free_gpu_mem_fraction"]


def test_the_spelling_table_is_the_recorded_parsers():
    """One row per series; each row's tags and drafter key are what the recorded source declares, what it was
    not read for is None, and no 1.x row claims to be verified."""
    from trtspec.backends.trtllm_versions import CANONICAL, LLMAPI_SPELLINGS, known_versions, series

    assert {series(v) for v in known_versions()} == set(LLMAPI_SPELLINGS) == {"1.0", "1.1", "1.2"}
    for row in [*LLMAPI_SPELLINGS.values(), CANONICAL]:
        up = recorded(row.series)
        types, cls = up["parser"]["types"], up["classes"]
        assert types[row.draft_target] == "DraftTargetDecodingConfig", row
        assert types[dict(row.eagle3)["decoding_type"]] in ("EagleDecodingConfig", "Eagle3DecodingConfig"), row
        assert set(dict(row.eagle3)) - {"decoding_type"} <= set(cls["EagleDecodingConfig"]["fields"]), row
        assert row.drafter_key in cls["DecodingBaseConfig"]["fields"], row
        assert row.aux_layers == ("eagle3_layers_to_capture" in cls["EagleDecodingConfig"]["fields"]), row
        if "same_as" in UPSTREAM["series"][row.series]:  # not read: nothing it was not read for is claimed
            assert row.schedule is None and not row.verified, row
        else:
            assert row.schedule == ("draft_len_schedule" in cls["DecodingBaseConfig"]["fields"]), row
    assert not any(r.verified for r in LLMAPI_SPELLINGS.values()) and CANONICAL.verified
    commit = UPSTREAM["series"]["main"]["read"].rsplit(" @ ", 1)[1]
    assert len(commit) == 40 and CANONICAL.read == f"main @ {commit}"


def test_versions_file_cites_what_a_reader_can_open():
    text = (ROOT / "trtspec" / "backends" / "trtllm_versions.py").read_text()
    assert "/work/" not in text and "shared" not in text and "index id" not in text
    assert "accepted by both versions read" not in text and "DraftTarget" in text and "Draft_Target" in text


# ------------------------------------------------------------------------------------------------ the probe

# Three parsers, shaped as the upstream sources read (trtspec/backends/trtllm_versions.py): the 1.x from_dict
# table; main's discriminated union with the speculative_model_dir alias; and a from_dict table with that alias
# whose Eagle config sets its fields one by one in __init__ (as the 1.1-era EagleDecodingConfig does), which
# would not honour the alias.
FROM_DICT = '''
from pathlib import Path
from typing import Annotated, ClassVar, Literal, Optional, Union
from pydantic import AliasChoices, BaseModel, ConfigDict, Field


class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: Optional[int] = None
    DRAFTER

    @classmethod
    def from_dict(cls, data):
        table = {"Eagle": EagleDecodingConfig, "DraftTarget": DraftTargetDecodingConfig}
        config_class = table.get(data.get("decoding_type"))
        if config_class is None:
            raise ValueError(f"Invalid decoding type: {data.get('decoding_type')}")
        data.pop("decoding_type")
        return config_class(**data)


class EagleDecodingConfig(DecodingBaseConfig):
    eagle3_one_model: Optional[bool] = True
    eagle3_layers_to_capture: Optional[set[int]] = None
    decoding_type: ClassVar[str] = "Eagle"
    EAGLE_INIT


class DraftTargetDecodingConfig(DecodingBaseConfig):
    decoding_type: ClassVar[str] = "Draft_Target"


SpeculativeConfig = Optional[Union[DraftTargetDecodingConfig, EagleDecodingConfig]]


def update_llm_args_with_extra_dict(llm_args, llm_args_dict, extra_llm_api_options=None):
    if "speculative_config" in llm_args_dict:
        llm_args_dict["speculative_config"] = DecodingBaseConfig.from_dict(llm_args_dict["speculative_config"])
    return {**llm_args, **llm_args_dict}
'''
UNION = '''
from pathlib import Path
from typing import Annotated, Literal, Optional, Union
from pydantic import AliasChoices, BaseModel, ConfigDict, Field


class DecodingBaseConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_draft_len: Optional[int] = None
    speculative_model: Optional[Union[str, Path]] = Field(
        default=None, validation_alias=AliasChoices("speculative_model", "speculative_model_dir"))
    draft_len_schedule: Optional[dict[int, int]] = None


class EagleDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Eagle"] = "Eagle"
    eagle3_one_model: Optional[bool] = True
    eagle3_layers_to_capture: Optional[set[int]] = None


class Eagle3DecodingConfig(EagleDecodingConfig):
    decoding_type: Literal["Eagle3"] = "Eagle3"


class DraftTargetDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Draft_Target"] = "Draft_Target"


SpeculativeConfig = Annotated[Union[DraftTargetDecodingConfig, Eagle3DecodingConfig, EagleDecodingConfig],
                              Field(discriminator="decoding_type")]


def update_llm_args_with_extra_dict(llm_args, llm_args_dict, extra_llm_api_options=None):
    return {**llm_args, **llm_args_dict}
'''
MODEL_DIR_FIELD = "speculative_model_dir: Optional[Union[str, Path]] = None"
ALIAS_FIELD = ("speculative_model: Optional[Union[str, Path]] = Field(\n"
               "        default=None, validation_alias=AliasChoices('speculative_model', 'speculative_model_dir'))")
SETATTR_INIT = """def __init__(self, **kwargs):
        super().__init__()
        for name, value in kwargs.items():
            setattr(self, name, value)"""
DIALECTS = {"from_dict": FROM_DICT.replace("DRAFTER", MODEL_DIR_FIELD).replace("EAGLE_INIT", ""),
            "union": UNION,
            "from_dict, alias, setattr __init__": FROM_DICT.replace("DRAFTER", ALIAS_FIELD)
            .replace("EAGLE_INIT", SETATTR_INIT)}


def _probe(tmp_path: Path, llm_args: str) -> dict[str, str]:
    """{case label: "parses: <class>" / "refused"} of the probe run against a stand-in tensorrt_llm."""
    from click.testing import CliRunner

    from trtspec.backends.trtllm_versions import PROBE_SCRIPT
    from trtspec.cli import main

    command = CliRunner().invoke(main, ["repo", "llmapi-probe"]).output  # what a user pipes into the image
    assert shlex.split(command) == ["python3", "-c", PROBE_SCRIPT]
    assert CliRunner().invoke(main, ["repo", "llmapi-probe", "--script"]).output == PROBE_SCRIPT + "\n"
    pkg = tmp_path / "tensorrt_llm"
    (pkg / "llmapi").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "stand-in"\n')
    (pkg / "llmapi" / "__init__.py").write_text("")
    (pkg / "llmapi" / "llm_args.py").write_text(llm_args)
    res = subprocess.run([sys.executable, *shlex.split(command)[1:]], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "tensorrt_llm stand-in"
    out = {}
    for line in lines[1:]:
        label, _, verdict = line.partition(" parses: ") if " parses: " in line else line.partition(" refused: ")
        out[label.strip()] = f"parses: {verdict}" if " parses: " in line else "refused"
    return out


def test_the_probe_tells_which_spelling_a_container_parses(tmp_path):
    seen = {name: _probe(tmp_path / name.replace(" ", "_").replace(",", ""), text) for name, text in DIALECTS.items()}
    tags = ("DraftTarget", "Draft_Target", "Eagle", "Eagle3")
    assert all(f"{t} + {k}" in s for s in seen.values() for t in tags
               for k in ("speculative_model_dir", "speculative_model")), seen
    old, new, setattr_init = seen["from_dict"], seen["union"], seen["from_dict, alias, setattr __init__"]
    # 1.x: DraftTarget / Eagle with speculative_model_dir only (what trtspec writes for 1.0-1.2)
    assert {k for k, v in old.items() if v.startswith("parses")} == {
        "DraftTarget + speculative_model_dir", "Eagle + speculative_model_dir",
        "Eagle + speculative_model_dir + eagle3_layers_to_capture"}, old
    assert old["DraftTarget + speculative_model_dir"] == "parses: DraftTargetDecodingConfig"
    # main: the Literal tags, both drafter keys (the alias), no DraftTarget; draft_len_schedule declared
    assert new["Draft_Target + speculative_model_dir"] == new["Draft_Target + speculative_model"] == \
        "parses: DraftTargetDecodingConfig"
    assert new["Eagle3 + speculative_model"] == "parses: Eagle3DecodingConfig"
    assert new["DraftTarget + speculative_model"] == new["DraftTarget + speculative_model_dir"] == "refused"
    assert new["Draft_Target + speculative_model + draft_len_schedule"].startswith("parses")
    assert old["DraftTarget + speculative_model_dir + draft_len_schedule"] == "refused"
    # an __init__ that sets fields one by one does not honour the alias: the probe shows it (DraftTarget does)
    assert setattr_init["Eagle + speculative_model"] == "parses: EagleDecodingConfig"
    assert setattr_init["Eagle + speculative_model_dir"] == "refused"
    assert setattr_init["DraftTarget + speculative_model_dir"] == "parses: DraftTargetDecodingConfig"
