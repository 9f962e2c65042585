"""Request validation: every setting that would decode garbage, crash a step or exhaust the engine (NaN/inf
temperatures, non-integer or negative top_k, seeds outside uint64, absurd stop lists, ...) is refused with one
GenerationError line and a hint, wherever the request enters (generate, generate_batch, stream, submit); the
limits themselves are accepted."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings, strategies as st

from tests.runtime.family import VOCAB, engine
from trtspec.errors import GenerationError
from trtspec.runtime import SamplingParams
from trtspec.runtime.request import MAX_STOP_CHARS, MAX_STOP_STRINGS, MIN_TEMPERATURE

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def eng(fam):
    e = engine(fam, "draft-model", k=4, max_output_len=16)
    yield e
    e.close()


def entries(eng, prompt, sp):
    """Each way a request enters the engine, as a thunk."""
    return {"generate": lambda: eng.generate(prompt, sp),
            "generate_batch": lambda: eng.generate_batch([[1, 2], prompt], [SamplingParams(max_new_tokens=2), sp]),
            "stream": lambda: list(eng.stream(prompt, sp)),
            "submit": lambda: eng.submit(prompt, sp, lambda ev: None)}


BAD = {
    "temperature nan": (dict(temperature=NAN), "temperature"),
    "temperature inf": (dict(temperature=INF), "temperature"),
    "temperature -inf": (dict(temperature=-INF), "temperature"),
    "temperature tiny": (dict(temperature=1e-40), "temperature"),  # logits / T overflows: NaN probabilities
    "temperature str": (dict(temperature="0.7"), "temperature"),
    "top_p nan": (dict(temperature=1.0, top_p=NAN), "top_p"),
    "top_p inf": (dict(temperature=1.0, top_p=INF), "top_p"),
    "top_p > 1": (dict(temperature=1.0, top_p=1.5), "top_p"),
    "top_k negative": (dict(temperature=1.0, top_k=-1), "top_k"),
    "top_k float": (dict(temperature=1.0, top_k=2.5), "top_k"),
    "top_k nan": (dict(temperature=1.0, top_k=NAN), "top_k"),
    "seed negative": (dict(temperature=1.0, seed=-1), "seed"),
    "seed 2^64": (dict(temperature=1.0, seed=2**64), "seed"),
    "seed float": (dict(temperature=1.0, seed=1.5), "seed"),
    "max_new_tokens float": (dict(max_new_tokens=2.5), "max_new_tokens"),
    "max_new_tokens huge": (dict(max_new_tokens=10**12), "max_new_tokens"),
    "num_draft_tokens float": (dict(num_draft_tokens=1.5), "num_draft_tokens"),
    "end_id -2": (dict(end_id=-2), "end_id"),
    "end_id past vocab": (dict(end_id=VOCAB), "end_id"),
    "stop None": (dict(stop=None), "stop"),
    "stop empty string": (dict(stop=("",)), "stop"),
    "stop too many": (dict(stop=tuple(f"s{i}" for i in range(MAX_STOP_STRINGS + 1))), "stop"),
    "stop too long": (dict(stop=("x" * (MAX_STOP_CHARS + 1),)), "stop"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_settings_are_refused_everywhere(eng, case):
    kw, match = BAD[case]
    sp = SamplingParams(**{"max_new_tokens": 4, **kw})
    for where, call in entries(eng, [1, 2, 3], sp).items():
        with pytest.raises(GenerationError, match=match) as err:
            call()
        assert "\n" not in err.value.message and err.value.hint, (case, where)
    assert eng.num_active == 0 and eng.num_waiting == 0


@pytest.mark.parametrize("prompt", [[1, 2.5], [1, NAN], 7, [1, None], torch.tensor([1.0, 2.0])])
def test_bad_prompt_ids_are_refused_everywhere(eng, prompt):
    for call in entries(eng, prompt, SamplingParams(max_new_tokens=2)).values():
        with pytest.raises(GenerationError):
            call()


def test_the_limits_themselves_are_accepted(eng):
    longest = tuple(f"{i:02d}" * (MAX_STOP_CHARS // 2) for i in range(MAX_STOP_STRINGS - 1)) + ("w",)
    ok = [SamplingParams(max_new_tokens=16, temperature=MIN_TEMPERATURE, seed=0, end_id=-1),
          SamplingParams(max_new_tokens=1, temperature=1e6, top_k=10**9, top_p=1e-9, seed=2**64 - 1),
          SamplingParams(max_new_tokens=3, end_id=-1, num_draft_tokens=4),
          SamplingParams(max_new_tokens=3, end_id=VOCAB - 1, num_draft_tokens=0),
          SamplingParams(max_new_tokens=3, stop=longest)]
    prompts = [[1, 2], np.array([3, 4]), torch.tensor([5, 6]), [np.int32(7)], [8, 9]]
    res = eng.generate_batch(prompts, ok)
    assert [len(r.tokens) for r in res[:2]] == [16, 1] and all(r.finish_reason != "error" for r in res)
    assert res[4].finish_reason == "stop"  # every output word starts with "w"


FUZZ = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.text(max_size=3))


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(kw=st.fixed_dictionaries({}, optional={
    "max_new_tokens": st.one_of(st.integers(-2, 20), FUZZ), "temperature": st.one_of(st.floats(0, 3), FUZZ),
    "top_k": st.one_of(st.integers(-2, 200), FUZZ), "top_p": st.one_of(st.floats(0, 1.5), FUZZ),
    "seed": FUZZ, "end_id": st.one_of(st.integers(-3, VOCAB + 1), FUZZ),
    "num_draft_tokens": st.one_of(st.integers(-1, 6), FUZZ),
    "stop": st.one_of(st.lists(st.text(max_size=4), max_size=3).map(tuple), FUZZ)}))
def test_any_settings_are_refused_or_decode_sane_tokens(eng, kw):
    """Whatever the settings: a GenerationError at entry, or a normal finish with in-vocabulary tokens."""
    sp = SamplingParams(**kw)
    try:
        res = eng.generate([1, 2, 3], sp)
    except GenerationError as e:
        assert "\n" not in e.message and e.hint
        event("refused")
        return
    event("decoded")
    assert res.finish_reason in ("length", "eos", "stop") and all(0 <= t < VOCAB for t in res.tokens)
    assert 0 < len(res.tokens) <= sp.max_new_tokens
    assert math.isfinite(sp.temperature) and (sp.seed is None or 0 <= sp.seed < 2**64)
