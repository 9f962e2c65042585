"""Property tests of the spec parser: from valid specs, random mutations (dropped keys, wrong types, random
values, unknown keys, path-like names) either give a valid Spec or a SpecError whose every problem names a
key, never another exception; and in every valid Spec each name that becomes a path is one safe component.

Hypothesis runs derandomized (the same examples on every run, as CI needs) with a bounded example count."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, example, given, settings, strategies as st
from pydantic import BaseModel

from trtspec.check import load_spec, spec_from_dict
from trtspec.errors import SpecError
from trtspec.names import name_problem
from trtspec.spec import Spec

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

BASES: list[dict[str, Any]] = [
    {"schema": 1, "model": {"name": "demo", "target": "models/target", "dtype": "float32"},
     "speculative": {"method": "draft-model", "draft": "models/draft", "num_draft_tokens": 4},
     "limits": {"max_batch_size": 4, "max_input_len": 512, "max_output_len": 256},
     "runtime": {"kind": "torch", "device": "cpu", "torch": {"threads": 0}}, "gpu": {"type": "cpu"},
     "serving": {"ensemble_name": "ensemble", "http_port": 8000, "grpc_port": 8001, "metrics_port": 8002}},
    {"schema": 1, "model": {"name": "m", "target": "/abs/target", "tokenizer": "tok"},
     "speculative": {"method": "medusa", "heads": "medusa", "num_draft_tokens": 8,
                     "choices": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]}},
    {"schema": 1, "model": {"target": "t"}, "speculative": {"method": "eagle", "heads": "eagle",
                                                            "adaptive": {"enabled": False, "history": 16}}},
    {"schema": 1, "model": {"target": "t"},
     "speculative": {"method": "lookahead", "lookahead": {"window": 4, "ngram": 3, "verification_set": 4}}},
    {"schema": 1, "model": {"name": "big", "target": "t"}, "speculative": {"method": "draft-model", "draft": "d"},
     "runtime": {"kind": "trtllm-engine", "device": "cuda", "trtllm": {"use_draft_logits": True}},
     "gpu": {"type": "h200", "count": 2, "tensor_parallel": 2}},
]

PATH_KEYS = {("model", "target"), ("model", "tokenizer"), ("speculative", "draft"), ("speculative", "heads")}
NAME_KEYS = [("model", "name"), ("serving", "ensemble_name")]


def _schema_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every dotted key of the schema, as trtspec.toml spells it."""
    keys = set()
    for name, field in model.model_fields.items():
        if name == "source":
            continue
        key = prefix + (field.alias or name)
        keys.add(key)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys |= _schema_keys(field.annotation, key + ".")
    return keys


SCHEMA_KEYS = _schema_keys(Spec)
SCHEMA_PATHS = sorted(tuple(k.split(".")) for k in SCHEMA_KEYS)

PATH_LIKE = st.sampled_from(["", ".", "..", "../..", "a/b", "/", "a\\b", "-x", ".hidden", "x" * 129, "a b",
                             "ensemble", "preprocessing", "trtspec.repo.json", "~/models", "é", "a\0b"])
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-3, 70), st.integers(min_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), PATH_LIKE,
    st.sampled_from(["draft-model", "medusa", "eagle", "lookahead", "none", "torch", "trtllm-engine",
                     "trtllm-llmapi", "cuda", "cpu", "h100", "float16", "bfloat16", "4", "true"]),
    st.dates(), st.times(), st.datetimes())
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


PLAUSIBLE = st.one_of(st.integers(0, 70), st.booleans(), PATH_LIKE, st.sampled_from(
    ["draft-model", "medusa", "eagle", "lookahead", "none", "torch", "trtllm-engine", "trtllm-llmapi", "cuda", "cpu",
     "h100", "float16", "bfloat16", "demo", "ensemble_v2"]),
    st.lists(st.lists(st.integers(-1, 3), max_size=4), max_size=6))
NAMED = sorted(PATH_KEYS) + NAME_KEYS  # keys whose values become paths or path names


@st.composite
def mutated_specs(draw) -> tuple[dict, set[str]]:
    """(a mutated copy of a valid spec, the dotted keys the mutations touched)."""
    data = _copy(draw(st.sampled_from(BASES)))
    touched: set[str] = set()
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["any", "any", "plausible", "plausible", "name", "drop", "unknown"]))
        path = draw(st.sampled_from(NAMED if kind == "name" else SCHEMA_PATHS))
        if kind == "unknown":
            path = path[:-1] + (draw(st.text(min_size=1, max_size=10)),)
        parent = data
        for part in path[:-1]:  # create or replace the tables on the way (a scalar in the way is replaced)
            if not isinstance(parent.get(part), dict):
                parent[part] = {}
            parent = parent[part]
        if kind == "drop":
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = draw({"any": VALUES, "plausible": PLAUSIBLE, "name": PATH_LIKE}.get(kind, VALUES))
        touched.add(".".join(path))
    return data, touched


def _copy(obj):
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy(v) for v in obj]
    return obj


def _names_a_key(problem: str, keys: set[str]) -> bool:
    return any(problem == k or problem.startswith(k + sep) for k in keys for sep in (" = ", ": ", ".", "["))


def _safe_component(value: str) -> bool:
    root = Path("/srv/out")
    return (name_problem(value) is None and value not in (".", "..") and "/" not in value and "\0" not in value
            and (root / value).resolve().parent == root and Path(value).name == value)


@SETTINGS
@given(mutated_specs())
@example(({"schema": 1, "model": {"target": "t"}, "serving": {"ensemble_name": ".."}}, {"serving.ensemble_name"}))
@example(({"schema": 1, "model": {"target": "t", "name": "a/b"}}, {"model.name"}))
@example(({"schema": 1, "model": {"target": "t", "name": "a\0b"}}, {"model.name"}))
@example(({"schema": 1, "model": {"target": "t"}, "limits": {"max_input_len": math.nan}}, {"limits.max_input_len"}))
@example(({"schema": 1, "model": {"target": "t"}, "runtime": {"torch": {"threads": datetime.date(2024, 1, 1)}}},
          {"runtime.torch.threads"}))
@example(({"schema": 1, "model": {"target": "~nosuchuser/m"}}, {"model.target"}))  # no such home: a problem
@example(({"schema": 1, "model": {"target": "t", "tokenizer": "a\0b"}}, {"model.tokenizer"}))
def test_a_mutated_spec_is_valid_or_a_spec_error_naming_a_key(case):
    data, touched = case
    try:
        spec = spec_from_dict(data, base=Path("/srv/specs"))
    except SpecError as exc:
        assert exc.problems and exc.message.startswith(exc.problems[0]), (exc.message, exc.problems)
        for problem in exc.problems:
            assert _names_a_key(problem, SCHEMA_KEYS | touched), (problem, touched)
        assert exc.hint
        return
    for section, key in NAME_KEYS:
        value = getattr(getattr(spec, section), key)
        assert _safe_component(value), (f"{section}.{key}", value)
    for section, key in PATH_KEYS:
        value = getattr(getattr(spec, section), key)
        assert value is None or value.is_absolute(), (f"{section}.{key}", value)
    assert spec_from_dict(spec.to_dict()) == spec  # what `with_runtime` relies on: a valid spec re-validates


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                 st.sampled_from([b"schema = 1\n[model]\ntarget = 't'\n", b"[model\n", b"\xff\xfe", b"a = 1\na = 2\n",
                                  b"schema = 1\nmodel = 5\n", b"schema = 1\n[model]\nname = '..'\ntarget = 't'\n"])))
def test_any_file_content_loads_or_is_a_spec_error(tmp_path_factory, content):
    path = tmp_path_factory.getbasetemp() / "property.toml"
    path.write_bytes(content)
    try:
        load_spec(path)
    except SpecError as exc:
        assert exc.message and exc.hint


def _scalar_leaves(model: type[BaseModel], prefix: str = "") -> dict[str, type]:
    """{dotted key: int | float | bool | str} of the schema's plain scalar fields."""
    out: dict[str, type] = {}
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out |= _scalar_leaves(field.annotation, key + ".")
        elif field.annotation in (int, float, bool, str):
            out[key] = field.annotation
    return out


SCALAR_LEAVES = _scalar_leaves(Spec)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(SCALAR_LEAVES)),
       st.one_of(st.booleans(), st.integers(-3, 70), st.floats(-1, 70), st.sampled_from(["4", "0.5", "true", "x"])))
@example("limits.max_batch_size", True)
@example("limits.max_batch_size", "4")
@example("serving.streaming", 1)
def test_a_value_of_another_toml_type_is_refused_naming_its_key(key, value):
    """No lax coercion: `true` is not 1, `"4"` is not 4, `4.0` is not 4, 1 is not true (an int for a float is
    fine: TOML writes `fallback_acceptance = 0`)."""
    kind = SCALAR_LEAVES[key]
    assume(type(value) is not kind and not (kind is float and type(value) is int))  # else range checks decide
    data = _copy(BASES[0])
    *tables, leaf = key.split(".")
    parent = data
    for part in tables:
        parent = parent.setdefault(part, {})
    parent[leaf] = value
    try:
        spec_from_dict(data)
    except SpecError as exc:
        assert any(p.startswith(f"{key} = {value!r}: ") for p in exc.problems), (key, value, exc.problems)
        return
    raise AssertionError(f"{key} = {value!r} ({type(value).__name__}) was accepted for a {kind.__name__} field")
