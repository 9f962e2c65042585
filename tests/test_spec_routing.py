"""A routed spec (method routed: [[speculative.drafters]] + [speculative.router]): what it accepts, and every
problem named under its key, each drafter checked as it would be alone."""

from __future__ import annotations

import copy

import pytest

from tests.support import DEMO, needs_demo_models
from trtspec.check import load_spec, spec_from_dict
from trtspec.errors import SpecError
from trtspec.spec import drafter_spec

ROUTED = {"schema": 1, "model": {"target": "t"},
          "speculative": {"method": "routed",
                          "drafters": [{"name": "prose", "method": "draft-model", "draft": "d"},
                                       {"name": "code", "method": "ngram", "num_draft_tokens": 8}],
                          "router": {"default": "prose", "routes": {"code": "code"}}}}


def _problems(**change) -> list[str]:
    data = copy.deepcopy(ROUTED)
    for path, value in change.items():
        *keys, last = path.split("__")
        at = data
        for k in keys:
            at = at[int(k)] if isinstance(at, list) else at[k]
        if value is None:
            del at[last]
        else:
            at[last] = value
    with pytest.raises(SpecError) as e:
        spec_from_dict(data)
    return e.value.problems


def test_a_routed_spec_loads_and_each_drafter_is_a_single_drafter_spec():
    spec = spec_from_dict(ROUTED)
    prose, code = (drafter_spec(spec, d) for d in spec.speculative.drafters)
    assert (prose.method, str(prose.speculative.draft), code.method, code.speculative.num_draft_tokens) == \
        ("draft-model", "d", "ngram", 8)
    assert spec.speculative.router.kind == "classify"  # the default
    assert "num_draft_tokens" not in spec.to_dict()["speculative"]  # K is per drafter
    assert spec_from_dict(spec.to_dict()) == spec  # what the build writes to spec.json reads back


def test_a_single_drafter_spec_reads_as_before():
    data = spec_from_dict({"schema": 1, "model": {"target": "t"}, "speculative": {"draft": "d"}}).to_dict()
    assert "drafters" not in data["speculative"] and "router" not in data["speculative"]


@pytest.mark.parametrize("change, expected", [
    ({"speculative__drafters__1__name": "prose"}, "speculative.drafters[1].name = 'prose': another drafter has"),
    ({"speculative__router__default": "chat"}, "speculative.router.default = 'chat': no drafter has this name"),
    ({"speculative__router__routes": {"code": "ngram"}}, "speculative.router.routes.code = 'ngram': no drafter"),
    ({"speculative__drafters__0__draft": None}, "speculative.drafters[0].draft: method 'draft-model' needs a draft"),
    ({"speculative__drafters__1__method": "routed"}, "speculative.drafters[1].method = 'routed': a drafter cannot"),
    ({"speculative__drafters": [{"name": "only", "method": "ngram"}]}, "needs at least two drafters"),
    ({"speculative__router": None}, "speculative.router: a routed spec needs a router"),
    ({"speculative__num_draft_tokens": 4}, "speculative.num_draft_tokens = 4: a routed spec takes K per drafter"),
    ({"speculative__schedule": {"1": 4}}, "speculative.schedule"),
    ({"speculative__drafters": [{"name": "a", "method": "medusa", "heads": "m"},
                                {"name": "b", "method": "eagle", "heads": "e"}]}, "at most one drafter with heads"),
    ({"speculative__router__kind": "guess"}, "speculative.router.kind = 'guess'"),
    ({"speculative__drafters__0__name": "../x"}, "speculative.drafters.0.name = '../x'"),
])
def test_routed_spec_problems_name_their_key(change, expected):
    problems = _problems(**change)
    assert any(expected in p for p in problems), problems


def test_drafters_need_method_routed():
    data = {"schema": 1, "model": {"target": "t"}, "speculative": {"method": "ngram", "drafters": [], "router": {
        "default": "x"}}}
    with pytest.raises(SpecError) as e:
        spec_from_dict(data)
    assert any("speculative.drafters: only a routed spec has several drafters" in p for p in e.value.problems)


def test_a_routed_spec_is_refused_by_the_tensorrt_llm_runtimes():
    data = copy.deepcopy(ROUTED)
    data["runtime"] = {"kind": "trtllm-llmapi", "device": "cuda"}
    data["gpu"] = {"type": "h100"}
    with pytest.raises(SpecError, match="speculative.method = 'routed': one LLM takes one speculative_config"):
        spec_from_dict(data)


@needs_demo_models
def test_the_demo_routed_spec_checks_its_pair_and_builds_each_drafters_weights():
    from trtspec import methods
    from trtspec.builders.torch_build import engine_spec_dict, roles
    from trtspec.methods import check_pair

    spec = load_spec(DEMO / "routed.toml")
    assert check_pair(spec).problems == []
    role_dirs = roles(spec, methods.get(spec.method))
    assert set(role_dirs) == {"target", "draft-prose"}
    built = engine_spec_dict(spec, role_dirs)["speculative"]["drafters"]
    assert built[0]["draft"] == "draft-prose" and "draft" not in built[1]
    assert methods.get(spec.method).drafter(spec)["prose"]["method"] == "draft-model"


@needs_demo_models
def test_generate_local_routes_by_task_and_refuses_an_unknown_one():
    import json

    from click.testing import CliRunner

    from trtspec.cli import main

    args = ["generate", "--local", "-c", str(DEMO / "routed.toml"), "-p", "def main():\n    ", "-n", "6", "--json"]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["drafter"] == "code"  # classified
    out = CliRunner().invoke(main, args + ["--task", "prose"])
    assert out.exit_code == 0 and json.loads(out.output)["drafter"] == "prose"
    bad = CliRunner().invoke(main, args + ["--task", "kode"])
    assert (bad.exit_code != 0 and "error: unknown task 'kode'" in bad.output
            and "hint: send one of code, prose" in bad.output)
