"""speculative.schedule: the spec rules, K per batch size in the torch runtime, and the LLM API's floored
draft_len_schedule."""

from __future__ import annotations

import pytest

from tests.runtime import family
from trtspec.check import load_spec, spec_from_dict
from trtspec.errors import SpecError
from trtspec.spec import draft_len_schedule, schedule_k


def _spec(schedule, *, k=4, batch=4, method="draft-model", **extra):
    data = {"schema": 1, "model": {"target": "t"}, "limits": {"max_batch_size": batch},
            "speculative": {"method": method, "num_draft_tokens": k, "schedule": schedule,
                            **({"draft": "d"} if method == "draft-model" else {})}}
    for key, value in extra.items():
        data[key] = value
    return spec_from_dict(data)


def test_toml_table_keys_become_batch_sizes(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('schema = 1\n[model]\ntarget = "t"\n[speculative]\ndraft = "d"\n'
                    "schedule = {1 = 4, 3 = 2, 4 = 0}  # bands\n")
    assert load_spec(path).speculative.schedule == {1: 4, 3: 2, 4: 0}


@pytest.mark.parametrize("schedule, problem", [
    ({"0": 2}, "speculative.schedule.0 = 2: batch size 0 is outside 1..limits.max_batch_size (4)"),
    ({"8": 2}, "speculative.schedule.8 = 2: batch size 8 is outside 1..limits.max_batch_size (4)"),
    ({"2": 5}, "speculative.schedule.2 = 5: K must be in 0..speculative.num_draft_tokens (4)"),
    ({"1": 2}, "speculative.schedule.1 = 2: batch 1's K is speculative.num_draft_tokens (4"),
    ({}, "speculative.schedule = {}: empty schedule"),
    ({"two": 2}, "speculative.schedule.two.[key]"),
])
def test_bad_schedules_name_the_band(schedule, problem):
    with pytest.raises(SpecError) as err:
        _spec(schedule)
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems


def test_a_method_that_drafts_nothing_takes_no_schedule():
    with pytest.raises(SpecError) as err:
        _spec({"2": 1}, method="none")
    assert any("drafts nothing to schedule" in p for p in err.value.problems)


def test_schedule_k_reads_keys_as_the_smallest_batch_of_a_band():
    s = {1: 4, 3: 2, 8: 0}
    assert [schedule_k(s, 4, b) for b in (1, 2, 3, 7, 8, 64)] == [4, 4, 2, 2, 0, 0]
    assert [schedule_k({4: 1}, 3, b) for b in (1, 3, 4)] == [3, 3, 1]  # below every key: K max


def test_draft_len_schedule_has_key_one_a_floor_and_covers_every_batch():
    spec = _spec({"2": 2, "3": 0}, batch=8)
    # key 1 = max_draft_len (TensorRT-LLM's validator); 0 floored to 1 (PR #16888); the last band repeated at
    # max_batch_size, so an upper-bound reading of the keys never reaches an implicit 0 either
    assert draft_len_schedule(spec) == {1: 4, 2: 2, 3: 1, 8: 1}
    assert draft_len_schedule(_spec({"4": 1})) == {1: 4, 4: 1}
    assert draft_len_schedule(spec_from_dict({"schema": 1, "model": {"target": "t"},
                                              "speculative": {"draft": "d"}})) is None


def test_the_llmapi_model_yaml_carries_the_floored_schedule():
    from trtspec.backends.trtllm_llmapi_methods import llm_args
    from trtspec.repository.trtllm.llmapi import model_yaml

    spec = _spec({"2": 0}, runtime={"kind": "trtllm-llmapi", "device": "cuda"}, gpu={"type": "h100"})
    sc = model_yaml(spec, llm_args(spec))["speculative_config"]
    assert sc["draft_len_schedule"] == {1: 4, 2: 1, 4: 1} and sc["max_draft_len"] == 4


def _scheduled_engine(fam, schedule, **kw):
    from trtspec import methods

    spec = load_spec(family.write_spec(fam, "draft-model", draft="draft_near", **kw))
    data = spec.to_dict()
    data["speculative"]["schedule"] = {str(b): k for b, k in schedule.items()}
    return methods.engine(spec_from_dict(data))


def _run(engine, prompts, lengths):
    from trtspec.runtime import SamplingParams

    steps = []
    engine.on_step.append(lambda s: steps.append((s.batch_size, list(s.drafted), list(s.accepted))))
    out = engine.generate_batch(prompts, [SamplingParams(max_new_tokens=n) for n in lengths])
    return out, steps


PROMPTS = ["w1 w2 w3 w4 w5", "w10 w20 w30", "w7 w7 w8 w9", "w3 w4"]


def test_the_engine_caps_k_by_the_schedule_at_each_batch_size(fam):
    engine = _scheduled_engine(fam, {1: 4, 2: 1})
    try:
        _, steps = _run(engine, PROMPTS[:3], [40, 6, 6])
    finally:
        engine.close()
    crowded = [d for b, d, _ in steps if b >= 2]
    alone = [d for b, d, _ in steps if b == 1]
    assert crowded and all(max(d) <= 1 for d in crowded) and any(max(d) == 1 for d in crowded)
    assert alone and max(max(d) for d in alone) > 1  # batch 1: back to up to 4


def test_a_zero_band_leaves_the_drafter_in_step_and_output_unchanged(fam):
    """K = 0 while 2+ requests run, then the long request runs alone: the draft model catches up on what it
    missed, so its drafts are accepted again (a stale draft cache would propose from the wrong context), and
    greedy output equals plain decoding."""
    from trtspec.runtime import SamplingParams

    engine = _scheduled_engine(fam, {1: 4, 2: 0})
    try:
        results, steps = _run(engine, PROMPTS, [48, 8, 8, 8])
        plain = [engine.generate(p, SamplingParams(max_new_tokens=n, num_draft_tokens=0)).tokens
                 for p, n in zip(PROMPTS, [48, 8, 8, 8])]
    finally:
        engine.close()
    assert all(sum(d) == 0 for b, d, _ in steps if b >= 2)
    tail = [(d[0], a[0]) for b, d, a in steps if b == 1]
    drafted, accepted = sum(d for d, _ in tail), sum(a for _, a in tail)
    assert drafted > 0 and accepted / drafted > 0.5, tail
    assert [r.tokens for r in results] == plain
