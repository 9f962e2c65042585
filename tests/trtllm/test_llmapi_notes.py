"""What `trtspec check` says about the LLM API's model.yaml without failing (the spec keys a runtime drops, a
spelling not read at its release) and what it refuses (a spec feature the TensorRT-LLM version cannot take)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tests.trtllm import fixtures as fx
from tests.trtllm.conftest import METHOD_BODIES, spec_text
from trtspec.cli import main

OLD = {"1.0.0": "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3",
       "1.1.0": "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"}
CUSTOM = 'version = "1.3.0rc27"\nimage = "registry.example/trtllm:1.3.0rc27"\n'


def _check(workdir, name: str, body: str, *, kind: str = "trtllm-llmapi", trtllm: str = "", device: str = "cuda"):
    text = spec_text("none", name=name, kind=kind, trtllm=trtllm).replace(METHOD_BODIES["none"], body)
    if device == "cpu":
        text = text.replace('device = "cuda"', 'device = "cpu"').replace('type = "h100"', 'type = "cpu"')
        text = text.replace('dtype = "float16"', 'dtype = "float32"')
    path = fx.write_spec(workdir / f"{name}.toml", text)
    return CliRunner().invoke(main, ["check", "-c", str(path), "--no-models"])


def _notes(res) -> list[str]:
    return [line.removeprefix("note: ") for line in res.output.splitlines() if line.startswith("note: ")]


NGRAM = METHOD_BODIES["ngram"] + "candidates = 8\n[speculative.adaptive]\nhistory = 4\n"


def test_check_names_the_keys_the_llm_api_drops_as_notes(workdir):
    res = _check(workdir, "ng", NGRAM)
    assert res.exit_code == 0 and res.output.rstrip().endswith("ok"), res.output
    dropped = [n for n in _notes(res) if "has no effect" in n]
    assert dropped == [
        "speculative.adaptive has no effect under runtime 'trtllm-llmapi': the LLM API has no per-request adaptive K "
        "(speculative.schedule sets K by load, as draft_len_schedule)",
        "speculative.ngram.candidates has no effect under runtime 'trtllm-llmapi': the LLM API's NGram drafter "
        "proposes one chain, not a trie of candidate continuations"]
    # a default the spec never wrote is no choice of the user's: nothing to tell
    assert not [n for n in _notes(_check(workdir, "ng0", METHOD_BODIES["ngram"])) if "has no effect" in n]
    # the torch runtime uses both: no note there
    torch = _check(workdir, "ngt", NGRAM, kind="torch", device="cpu")
    assert torch.exit_code == 0 and not [n for n in _notes(torch) if "has no effect" in n], torch.output


def test_eagle_choices_suffix_knobs_and_engine_schedules_are_noted(workdir):
    eagle = _check(workdir, "ea", METHOD_BODIES["eagle"] + "choices = [[0], [0, 0]]\n")
    assert any(n.startswith("speculative.choices has no effect under runtime 'trtllm-llmapi'") for n in _notes(eagle))
    suffix = ('[speculative]\nmethod = "suffix"\nnum_draft_tokens = 4\n'
              "[speculative.suffix]\nmax_depth = 32\ncache_requests = 16\n")
    sa = _check(workdir, "sa", suffix, trtllm=CUSTOM)
    assert sa.exit_code == 0, sa.output
    assert [n.split(" has")[0] for n in _notes(sa) if "has no effect" in n] == ["speculative.suffix.max_depth"]
    engine = _check(workdir, "en", METHOD_BODIES["draft-model"] + "schedule = {1 = 4, 2 = 2}\n", kind="trtllm-engine")
    assert engine.exit_code == 0, engine.output
    assert any(n.startswith("speculative.schedule has no effect under runtime 'trtllm-engine'") for n in _notes(engine))


@pytest.mark.parametrize("version", list(OLD))
def test_a_schedule_is_refused_where_the_version_has_no_draft_len_schedule(workdir, version):
    body = METHOD_BODIES["draft-model"] + "schedule = {1 = 4, 2 = 2}\n"
    res = _check(workdir, "old", body, trtllm=f'version = "{version}"\nimage = "{OLD[version]}"\n')
    assert res.exit_code == 2, res.output
    assert (f"speculative.schedule = {{1: 4, 2: 2}}: TensorRT-LLM {version}'s speculative_config declares no "
            "draft_len_schedule") in res.output
    assert 'fix: remove speculative.schedule, or set version = "1.2.1"' in res.output
    # 1.2.1 takes it, and says it was not verified; a later version's (main's union, read) says nothing
    res = _check(workdir, "new", body)
    assert res.exit_code == 0 and any("whether TensorRT-LLM 1.2.1 declares draft_len_schedule" in n
                                      for n in _notes(res)), res.output
    res = _check(workdir, "later", body, trtllm=CUSTOM)
    said = [n for n in _notes(res) if "draft_len_schedule" in n or "spelling" in n]
    assert res.exit_code == 0 and not said, res.output


def test_every_1x_spelling_is_noted_as_not_read_at_its_release(workdir):
    for version, image in {**OLD, "1.2.1": "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"}.items():
        res = _check(workdir, "dm", METHOD_BODIES["draft-model"], trtllm=f'version = "{version}"\nimage = "{image}"\n')
        spelled = [n for n in _notes(res) if "speculative_config spelling" in n]
        assert len(spelled) == 1 and spelled[0].startswith(
            f"TensorRT-LLM {version}'s speculative_config spelling (decoding_type DraftTarget / Eagle, "
            "speculative_model_dir)") and "trtspec repo llmapi-probe" in spelled[0], res.output
    assert not [n for n in _notes(_check(workdir, "pl", METHOD_BODIES["none"])) if "spelling" in n]


def test_an_eagle3_head_that_names_its_layers_is_refused_on_1_0(tmp_path):
    """TensorRT-LLM 1.0's EagleDecodingConfig has no eagle3_layers_to_capture: build refuses, and `check` (with
    the models) says so as a problem; 1.1 takes the head."""
    from tests.train.eagle3_support import save_eagle3, save_target4
    from trtspec.backends.trtllm_llmapi_methods import llm_args
    from trtspec.check import load_spec, run_check
    from trtspec.errors import PairError, RepositoryError

    target = save_target4(tmp_path / "target")
    head = save_eagle3(tmp_path / "head", target, draft_vocab=48)
    specs = {}
    for version, image in OLD.items():
        path = tmp_path / f"{version}.toml"
        path.write_text(f'schema = 1\n[model]\ntarget = "{target}"\ndtype = "float16"\n[speculative]\n'
                        f'method = "eagle"\nheads = "{head}"\n[limits]\nmax_input_len = 64\nmax_output_len = 64\n'
                        f'[runtime]\nkind = "trtllm-llmapi"\ndevice = "cuda"\n[runtime.trtllm]\nversion = "{version}"\n'
                        f'image = "{image}"\n[gpu]\ntype = "h100"\n')
        specs[version] = load_spec(path)
    with pytest.raises(RepositoryError, match=r"captures the target's layers \[0, 1, 3\], and TensorRT-LLM 1\.0\.0's "
                                              r"EagleDecodingConfig declares no eagle3_layers_to_capture") as exc:
        llm_args(specs["1.0.0"])
    assert exc.value.hint == 'set version = "1.2.1" and image = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"'
    report = run_check(specs["1.0.0"])
    assert report.error is PairError and len(report.problems) == 1 and "(fix: set version" in report.problems[0]
    assert llm_args(specs["1.1.0"])["speculative_config"]["eagle3_layers_to_capture"] == [0, 1, 3]
    assert run_check(specs["1.1.0"]).ok
