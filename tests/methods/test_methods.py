"""The method registry: every built-in method in the spec's order, the one place method names are compared, the
rules stated once (TensorRT-LLM's max_draft_len, EAGLE without pipeline parallelism)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import ROOT
from trtspec import methods
from trtspec.check import spec_from_dict
from trtspec.convert import params
from trtspec.errors import SpecError
from trtspec.methods.lookahead import lookahead_max_draft_len

BUILTIN = ("draft-model", "medusa", "eagle", "lookahead", "ngram", "suffix", "none")


def _spec(**speculative):
    return {"schema": 1, "model": {"target": "t"}, "speculative": speculative}


def test_the_registry_holds_the_builtin_methods_in_the_specs_order():
    assert methods.names()[:7] == BUILTIN
    assert [m.name for m in methods.registered()][:7] == list(BUILTIN)
    with pytest.raises(SpecError, match="unknown speculative method 'medussa'"):
        methods.get("medussa")
    with pytest.raises(ValueError, match="taken"):
        methods.register(methods.get("medusa"))


def test_an_unknown_method_is_refused_as_a_literal_listing_the_names():
    with pytest.raises(SpecError) as err:
        spec_from_dict(_spec(method="medussa"))
    assert err.value.problems == ["speculative.method = 'medussa': Input should be 'draft-model', 'medusa', 'eagle', "
                                  "'lookahead', 'ngram', 'suffix', 'none' or 'routed' "
                                  "(fix: use one of the allowed values)"]
    with pytest.raises(SpecError, match=r"speculative\.method = 3: Input should be 'draft-model'"):
        spec_from_dict(_spec(method=3))


def test_lookahead_draft_len_matches_trtllm_formula():
    assert lookahead_max_draft_len(7, 7, 7) == 83
    assert lookahead_max_draft_len(4, 1, 0) == 0 + 3 * 0


def test_the_256_limit_and_the_eagle_pipeline_rule_are_stated_once():
    """One limit (convert.params) and one pipeline rule (Method.pipeline_problem) behind the spec, the converter
    and the builder alike."""
    assert params.draft_len_excess(256) is None and params.draft_len_excess(257) == "max_draft_len 257 > 256"
    gpu = {"type": "h100", "count": 2, "pipeline_parallel": 2}
    rt = {"kind": "trtllm-engine", "device": "cuda"}
    with pytest.raises(SpecError) as err:
        spec_from_dict(_spec(method="lookahead", lookahead={"window": 16, "ngram": 16, "verification_set": 4})
                       | {"runtime": rt, "gpu": {"type": "h100"}})
    assert any("needs max_draft_len 299 > 256" in p for p in err.value.problems)
    with pytest.raises(SpecError) as err:
        spec_from_dict(_spec(method="eagle", heads="h") | {"runtime": rt, "gpu": gpu})
    assert any("gpu.pipeline_parallel = 2: EAGLE does not support pipeline parallelism" in p
               for p in err.value.problems)
    assert spec_from_dict(_spec(method="medusa", heads="h") | {"runtime": rt, "gpu": gpu}).method == "medusa"


def test_the_llmapi_refusal_of_medusa_names_the_methods_it_serves():
    with pytest.raises(SpecError) as err:
        spec_from_dict(_spec(method="medusa", heads="h") | {"runtime": {"kind": "trtllm-llmapi", "device": "cuda"},
                                                            "gpu": {"type": "h100"}})
    (problem,) = err.value.problems
    assert problem.startswith("speculative.method = 'medusa': the TensorRT-LLM LLM API (PyTorch backend) does not "
                              "support Medusa")
    assert problem.endswith("or method draft-model, eagle, ngram or suffix)")


# every method name but "none", which names other things too (Triton's model-control mode)
COMPARED = (*BUILTIN[:6], "routed")
# modules with a vocabulary of their own that shares words with the methods' names: the trainers' training kinds
# (drafters.KINDS: eagle3, eagle, medusa, draft-model: what is trained, not what serves it), the vLLM export's
# method names (its own table of methods, as each runtime has)
OWN_VOCABULARY = ("train/drafters.py", "export/vllm.py")


def _compared_names(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every comparison against a method name in a module (==, !=, in, not in, match)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        else:
            continue
        for op in operands:
            items = op.elts if isinstance(op, (ast.Tuple, ast.List, ast.Set)) else [op]
            hits += [(node.lineno, i.value) for i in items if isinstance(i, ast.Constant) and i.value in COMPARED]
    return hits


def test_method_names_are_compared_only_inside_the_methods_package():
    """Every caller asks the registry or its runtime's method table (keyed by the methods' names, never compared):
    no `spec.method == "medusa"` or `method == "routed"` anywhere else in trtspec/ but the modules with a
    vocabulary of their own (OWN_VOCABULARY)."""
    package = ROOT / "trtspec"
    found = {str(p.relative_to(ROOT)): hits for p in sorted(package.rglob("*.py"))
             if "methods" not in p.relative_to(package).parts[:1]
             and p.relative_to(package).as_posix() not in OWN_VOCABULARY and (hits := _compared_names(p))}
    assert found == {}


def test_the_name_check_sees_a_comparison(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('def f(spec):\n    return spec.method == "routed" or spec.method in ("ngram",)\n')
    assert _compared_names(path) == [(2, "routed"), (2, "ngram")]
