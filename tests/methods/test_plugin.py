"""Adding a method = one module: a toy "repeat-last-token" method registered at test time plugs in through the
registry alone. The spec accepts it, `check` runs its rules, the torch runtime runs it through methods.engine
(greedy output identical to plain decoding), and the TensorRT-LLM runtimes, the converter and the build plan
refuse it cleanly (it declares no engine flags, checkpoint layout or LLM-API drafter)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tests.support import MODELS
from trtspec import methods
from trtspec.backends.trtllm_engine_methods import engine_method
from trtspec.backends.trtllm_llmapi_methods import llmapi_method
from trtspec.builders.trtllm.plan import make_plan
from trtspec.check import spec_from_dict
from trtspec.cli import main
from trtspec.errors import BuildError, ConvertError, RepositoryError, SpecError
from trtspec.methods.base import Method
from trtspec.runtime import Draft, DraftPlan, Proposer, SamplingParams
from trtspec.runtime.proposer import EMPTY, chain
from trtspec.spec import Problem

NAME = "repeat-last-token"


class RepeatLastProposer(Proposer):
    """Proposes the pending token k times (deterministic: verified as point masses)."""

    name = NAME

    def setup(self, target, max_batch: int, max_seq: int, k: int) -> DraftPlan:
        return DraftPlan.chain(k)

    def propose(self, batch) -> list[Draft]:
        return [Draft([seq[-1]] * k, chain(k)) if k else EMPTY for seq, k in zip(batch.seqs, batch.ks)]


class RepeatLast(Method):
    name = NAME
    title = NAME

    def problems(self, spec) -> list[Problem]:
        p = super().problems(spec)
        if spec.speculative.num_draft_tokens > 8:
            p.append(Problem("speculative.num_draft_tokens", spec.speculative.num_draft_tokens,
                             "repeat-last-token drafts at most 8 tokens", "set num_draft_tokens <= 8"))
        return p

    def proposer(self, spec, device: str) -> Proposer:
        return RepeatLastProposer()


@pytest.fixture
def toy():
    methods.register(RepeatLast())
    try:
        yield
    finally:
        methods.unregister(NAME)


def _spec(k: int = 4, runtime: str = "torch", **extra) -> dict:
    gpu = {"type": "cpu"} if runtime == "torch" else {"type": "h100"}
    dtype = "float32" if runtime == "torch" else "float16"  # TensorRT-LLM serves FP16/BF16 only
    return {"schema": 1, "model": {"name": "toy", "target": str(MODELS / "target"), "dtype": dtype},
            "speculative": {"method": NAME, "num_draft_tokens": k, "adaptive": {"enabled": False}, **extra},
            "limits": {"max_batch_size": 2, "max_input_len": 64, "max_output_len": 24},
            "runtime": {"kind": runtime, "device": "cpu" if runtime == "torch" else "cuda"}, "gpu": gpu}


def test_the_spec_takes_a_registered_method_and_runs_its_rules(toy):
    assert spec_from_dict(_spec()).method == NAME
    with pytest.raises(SpecError) as err:
        spec_from_dict(_spec(k=9, choices=[[0]]))
    assert err.value.problems == [
        "speculative.choices = [[0]]: a tree only applies to medusa and eagle (fix: remove speculative.choices)",
        "speculative.num_draft_tokens = 9: repeat-last-token drafts at most 8 tokens (fix: set num_draft_tokens <= 8)"]
    methods.unregister(NAME)
    with pytest.raises(SpecError, match=r"speculative\.method = 'repeat-last-token': Input should be"):
        spec_from_dict(_spec())


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """A tiny random Llama + tokenizer (tests/runtime/family.py)."""
    from tests.runtime import family

    root = tmp_path_factory.mktemp("toy")
    family.save_llama(root / "target", seed=1)
    family.save_tokenizer(root / "target")
    return root / "target"


def _toml(k: int, target) -> str:
    return (f'schema = 1\n[model]\nname = "toy"\ntarget = "{target}"\ndtype = "float32"\n'
            f'[speculative]\nmethod = "{NAME}"\nnum_draft_tokens = {k}\n'
            "[limits]\nmax_batch_size = 2\nmax_input_len = 64\nmax_output_len = 24\n")


def test_check_runs_the_plugins_rules(toy, tiny_target, tmp_path):
    ok, bad = tmp_path / "ok.toml", tmp_path / "bad.toml"
    ok.write_text(_toml(4, tiny_target))
    bad.write_text(_toml(9, tiny_target))
    good = CliRunner().invoke(main, ["check", "-c", str(ok)])
    assert good.exit_code == 0, good.output
    refused = CliRunner().invoke(main, ["check", "-c", str(bad)])
    assert refused.exit_code == 2 and "repeat-last-token drafts at most 8 tokens" in refused.output


def test_the_torch_runtime_runs_it_greedy_identical_to_plain_decoding(toy, tiny_target):
    data = _spec()
    data["model"]["target"] = str(tiny_target)
    eng = methods.engine(spec_from_dict(data))
    try:
        assert eng.method == NAME and eng.k_max == 4
        prompts = [[1, 2, 3], [5, 5, 5, 5], [7, 8, 9, 10, 11]]
        spec = eng.generate_batch(prompts, SamplingParams(max_new_tokens=24, end_id=-1, num_draft_tokens=4))
        plain = eng.generate_batch(prompts, SamplingParams(max_new_tokens=24, end_id=-1, num_draft_tokens=0))
    finally:
        eng.close()
    assert [r.tokens for r in spec] == [r.tokens for r in plain]
    assert sum(r.drafted for r in spec) > 0 and sum(r.drafted for r in plain) == 0


def test_the_tensorrt_llm_paths_refuse_it_cleanly(toy, tmp_path):
    for runtime, why in (("trtllm-engine", "trtspec has no TensorRT-LLM engine build for it"),
                         ("trtllm-llmapi", "trtspec maps it to no drafter of the TensorRT-LLM LLM API")):
        with pytest.raises(SpecError) as err:
            spec_from_dict(_spec(runtime=runtime))
        (problem,) = err.value.problems
        assert problem.startswith(f"speculative.method = '{NAME}': {why}")
        assert "(fix: use runtime.kind = \"torch\"" in problem
    spec = spec_from_dict(_spec())  # a torch spec handed to the TensorRT-LLM code paths directly
    with pytest.raises(BuildError, match="no TensorRT-LLM engine build"):
        make_plan(spec, engine_method(spec), engines_root=tmp_path)
    with pytest.raises(ConvertError, match="no TensorRT-LLM engine build"):
        engine_method(spec).conversions(spec, tmp_path)
    with pytest.raises(RepositoryError, match="cannot be served by runtime 'trtllm-llmapi'"):
        llmapi_method(spec).options(spec)
    assert not list(tmp_path.iterdir())
