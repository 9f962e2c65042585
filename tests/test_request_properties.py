"""Property tests of request validation: the served models' plain-Python checks (trtspec.repository.serving),
the request parsing of the preprocessing / tensorrt_llm / postprocessing models themselves (run without Triton
over a stand-in `triton_python_backend_utils`), and the engine's admission (`SpecEngine._make`, which is
`_validate` plus the request's set-up) on a tiny engine.

The property: any request either passes, or is refused with the error type that makes it a client error
(RequestError / GenerationError: INVALID_ARG, a one-line message); never another exception (which the models
would answer with "internal error"). Inputs are what Triton can deliver: each input of the emitted configs
present or missing, of its declared data type (Triton refuses any other before a model runs, see
docs/errors.md), with any batch size up to max_batch_size, any length where the config says -1, and any value."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from tests.runtime import family
from trtspec.check import load_spec
from trtspec.errors import GenerationError
from trtspec.repository import pbtxt, serving, textio
from trtspec.repository.torch_repo import ModelNames, generation_config, postprocessing_config, preprocessing_config
from trtspec.runtime import SamplingParams

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
MODELS = Path(__file__).resolve().parents[1] / "trtspec" / "repository" / "torch_models"
NUMPY = {pbtxt.mc.TYPE_BOOL: np.bool_, pbtxt.mc.TYPE_INT32: np.int32, pbtxt.mc.TYPE_UINT64: np.uint64,
         pbtxt.mc.TYPE_FP32: np.float32, pbtxt.mc.TYPE_STRING: np.object_}


# ------------------------------------------------------------------------ the models without Triton


class Tensor:
    def __init__(self, name, array):
        self.name, self.array = name, np.asarray(array)

    def as_numpy(self):
        return self.array


class Request:
    def __init__(self, inputs: dict[str, np.ndarray], parameters: str = "{}"):
        self.inputs, self._parameters = inputs, parameters

    def parameters(self) -> str:
        return self._parameters

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v.dtype}{list(v.shape)}:{v.tolist()!r:.60}" for k, v in self.inputs.items())
        return f"Request({shown}; parameters={self._parameters})"


class TritonError(Exception):
    INTERNAL, INVALID_ARG, UNAVAILABLE = "INTERNAL", "INVALID_ARG", "UNAVAILABLE"

    def __init__(self, message, code=INTERNAL):
        super().__init__(message)
        self.code = code


def _fake_pb_utils() -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    pb.Tensor, pb.TritonError = Tensor, TritonError
    pb.InferenceResponse = lambda output_tensors, error=None: types.SimpleNamespace(outputs=output_tensors,
                                                                                       error=error)
    pb.get_input_tensor_by_name = lambda request, name: (Tensor(name, request.inputs[name])
                                                         if name in request.inputs else None)
    pb.Logger = types.SimpleNamespace(log_error=lambda message: None)
    return pb


def _load_model(file: str) -> types.ModuleType:
    """trtspec/repository/torch_models/<file> as Triton loads it (a plain module importing pb_utils)."""
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = _fake_pb_utils()
    try:
        spec = importlib.util.spec_from_file_location(f"_trtspec_model_{Path(file).stem}", MODELS / file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop("triton_python_backend_utils", None)
        else:
            sys.modules["triton_python_backend_utils"] = saved
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny target + tokenizer, its lookahead spec (K = 4, batch 4, 16 in / 8 out) and engine."""
    root = tmp_path_factory.mktemp("tiny")
    family.save_llama(root / "target", seed=1)
    family.save_tokenizer(root / "target")
    spec = load_spec(family.write_spec(root, "lookahead", max_input_len=16, max_output_len=8))
    from trtspec import methods

    engine = methods.engine(spec)
    yield types.SimpleNamespace(spec=spec, engine=engine, tokenizer=engine.tokenizer)
    engine.close()


@pytest.fixture(scope="module")
def preprocessing(tiny):
    model = object.__new__(_load_model("preprocessing.py").TritonPythonModel)
    model.tokenizer, model.add_special_tokens = tiny.tokenizer, True
    model.max_input_len, model.max_output_len = tiny.spec.limits.max_input_len, tiny.spec.limits.max_output_len
    model.max_input_bytes = serving.prompt_byte_limit(model.max_input_len, textio.max_token_bytes(tiny.tokenizer))
    config = preprocessing_config(tiny.spec, ModelNames(), "engine")  # what initialize() reads
    model.allowed = set(config.parameters["request_inputs"].string_value.split(","))
    return model


@pytest.fixture(scope="module")
def generation(tiny):
    model = object.__new__(_load_model("tensorrt_llm.py").TritonPythonModel)
    model.engine, model.tokenizer, model.limits = tiny.engine, tiny.tokenizer, tiny.spec.limits
    return model


@pytest.fixture(scope="module")
def postprocessing(tiny):
    model = object.__new__(_load_model("postprocessing.py").TritonPythonModel)
    model.tokenizer, model.vocab = tiny.tokenizer, textio.vocab_bound(tiny.tokenizer)
    return model


# ------------------------------------------------------------------------------------- strategies

WORDS = st.lists(st.sampled_from(["w1", "w2", "w7", "w40", "</s>", "<unk>", " ", "x"]), max_size=24).map(" ".join)
BYTES = st.one_of(st.binary(max_size=40), WORDS.map(str.encode), st.text(max_size=20).map(str.encode),
                  st.just(b"w3 " * 400))


def _values(dtype) -> st.SearchStrategy:
    if dtype is np.object_:
        return BYTES
    if dtype is np.bool_:
        return st.booleans()
    if dtype is np.float32:
        return st.one_of(st.floats(width=32, allow_subnormal=False), st.sampled_from([0.0, 0.5, 1.0, -1.0]))
    info = np.iinfo(dtype)
    return st.one_of(st.integers(int(info.min), int(info.max)), st.integers(max(int(info.min), -2), 20))


def _one(dtype, value) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


IDS = st.lists(st.integers(0, family.VOCAB - 1), min_size=1, max_size=12)
SMALL = st.integers(0, 9)
# A well-formed request per model (the corruptions below then break it in every way Triton lets through).
WELL_FORMED = {
    "preprocessing": st.fixed_dictionaries(
        {"QUERY": WORDS.filter(str.strip).map(lambda w: _one(np.object_, w.encode())),
         "REQUEST_OUTPUT_LEN": st.integers(1, 8).map(lambda n: _one(np.int32, n))},
        optional={"STREAM": st.booleans().map(lambda b: _one(np.bool_, b)),
                  "TEMPERATURE": st.floats(0, 2, width=32, allow_subnormal=False).map(lambda t: _one(np.float32, t))}),
    "tensorrt_llm": IDS.flatmap(lambda ids: st.fixed_dictionaries(
        {"input_ids": st.just(np.array([ids], np.int32)), "input_lengths": st.just(_one(np.int32, len(ids))),
         "request_output_len": st.integers(1, 8).map(lambda n: _one(np.int32, n))},
        optional={"end_id": st.integers(-1, family.VOCAB - 1).map(lambda n: _one(np.int32, n)),
                  "temperature": st.sampled_from([0.0, 0.7, 1.0]).map(lambda t: _one(np.float32, t)),
                  "runtime_top_k": SMALL.map(lambda n: _one(np.int32, n)),
                  "runtime_top_p": st.sampled_from([0.05, 0.5, 0.9, 1.0]).map(lambda t: _one(np.float32, t)),
                  "seed": st.integers(0, 2**64 - 1).map(lambda n: _one(np.uint64, n)),
                  "streaming": st.booleans().map(lambda b: _one(np.bool_, b)),
                  "stop_words": st.lists(st.sampled_from([b"w1", b"", b"w2 w3"]), min_size=1, max_size=3).map(
                      lambda ws: np.array([ws], np.object_)),
                  "num_draft_tokens": st.integers(0, 4).map(lambda n: _one(np.int32, n))})),
    "postprocessing": IDS.flatmap(lambda ids: st.fixed_dictionaries(
        {"TOKENS_BATCH": st.just(np.array([[ids]], np.int32)), "SEQUENCE_LENGTH": st.just(_one(np.int32, len(ids)))},
        optional={"CONTEXT_IDS": IDS.map(lambda c: np.array([c], np.int32)),
                  "IS_FINAL": st.booleans().map(lambda b: _one(np.bool_, b)),
                  "STOP_TRIM": SMALL.map(lambda n: _one(np.int32, n)),
                  "STOP_WORDS": st.just(np.array([[b"w1"]], np.object_)),
                  "NUM_STEPS": SMALL.map(lambda n: _one(np.int32, n))})),
}


@st.composite
def requests(draw, config: pbtxt.ModelConfig) -> Request:
    """A request to `config`'s model: a well-formed one with 0-3 corruptions (an input dropped, or replaced by
    any array of its declared type with any batch size and lengths; one row per request changed into several)
    and sometimes request parameters, known or not."""
    inputs = dict(draw(WELL_FORMED[config.name]))
    declared = {t.name: t for t in config.input}
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        name = draw(st.sampled_from(sorted(declared)))
        how = draw(st.sampled_from(["drop", "any", "any", "rows"]))
        if how == "drop":
            inputs.pop(name, None)
            continue
        t, dtype = declared[name], NUMPY[declared[name].data_type]
        rows = draw(st.integers(1, config.max_batch_size)) if how == "rows" else 1
        shape = (rows,) + tuple(draw(st.integers(0, 5)) if d == -1 else d for d in t.dims)
        inputs[name] = draw(hnp.arrays(dtype, shape, elements=_values(dtype)))
    keys = st.sampled_from(sorted(declared) + ["bogus", "triton_enable_empty_final_response"])
    params = draw(st.one_of(st.just({}), st.dictionaries(st.one_of(keys, st.text(max_size=6)),
                                                         st.one_of(st.integers(), st.text(max_size=4)), max_size=2)))
    return Request(inputs, json.dumps(params))


# -------------------------------------------------------------------------- the served models' checks


def test_the_stand_in_runs_a_good_request_through_every_model(tiny, preprocessing, generation, postprocessing):
    """The harness itself: a well-formed request passes each model's parsing (so the properties below test
    the checks, not a broken stand-in)."""
    ids, max_tokens = preprocessing._parse(Request({"QUERY": np.array([[b"w1 w2 w3"]], np.object_),
                                                    "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32)}))
    assert len(ids) >= 3 and max_tokens == 4
    got, params, streaming, task = generation.parse(Request({
        "input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
        "request_output_len": np.array([[max_tokens]], np.int32), "streaming": np.array([[True]])}))
    assert got == ids and params.max_new_tokens == 4 and streaming and task is None
    tiny.engine._make(got, params, lambda event: None, task)
    response = postprocessing._response(Request({"TOKENS_BATCH": np.array([[ids]], np.int32),
                                                 "SEQUENCE_LENGTH": np.array([[len(ids)]], np.int32)}))
    assert response.outputs[0].array.reshape(-1)[0].decode() == "w1 w2 w3"


@SETTINGS
@given(data=st.data())
def test_preprocessing_accepts_or_refuses_with_a_request_error(tiny, preprocessing, data):
    config = preprocessing_config(tiny.spec, ModelNames(), "engine")
    request = data.draw(requests(config))
    try:
        ids, max_tokens = preprocessing._parse(request)
    except serving.RequestError as exc:
        assert exc.message and "\n" not in exc.message
        event(f"refused: {exc.message[:24]}")
        return
    event("accepted")
    assert 1 <= len(ids) <= tiny.spec.limits.max_input_len and 1 <= max_tokens <= tiny.spec.limits.max_output_len


@SETTINGS
@given(data=st.data())
def test_the_generation_model_and_the_engine_accept_or_refuse_with_a_generation_error(tiny, generation, data):
    config = generation_config(tiny.spec, ModelNames(), "engine")
    request = data.draw(requests(config))
    try:
        ids, params, streaming, task = generation.parse(request)
        tiny.engine._make(ids, params, lambda event: None, task)  # admission: _validate + the request's set-up
    except GenerationError as exc:  # RequestError included
        assert exc.message and "\n" not in exc.message
        event(f"refused: {exc.message[:24]}")
        return
    event("accepted")
    assert 1 <= len(ids) <= tiny.spec.limits.max_input_len
    assert 1 <= params.max_new_tokens <= tiny.spec.limits.max_output_len
    assert all(0 <= t < tiny.engine.target.cfg.vocab_size for t in ids)
    assert math.isfinite(params.temperature) and math.isfinite(params.top_p)


@SETTINGS
@given(data=st.data())
def test_postprocessing_accepts_or_refuses_with_a_request_error(tiny, postprocessing, data):
    config = postprocessing_config(tiny.spec, ModelNames(), "engine")
    request = data.draw(requests(config))
    try:
        response = postprocessing._response(request)
    except serving.RequestError as exc:
        assert exc.message and "\n" not in exc.message
        event(f"refused: {exc.message[:24]}")
        return
    event("accepted")
    rows = request.inputs["TOKENS_BATCH"].shape[0]
    assert response.outputs[0].name == "OUTPUT" and response.outputs[0].array.shape == (rows, 1)


# ------------------------------------------------------------------ the plain checks, one by one

ARRAYS = st.one_of(
    hnp.arrays(st.sampled_from([np.bool_, np.int8, np.uint8, np.int32, np.int64, np.uint64, np.float16, np.float32,
                                np.float64]), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)),
    hnp.arrays(np.object_, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3), elements=BYTES))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(ARRAYS, st.sampled_from([int, float, bool, str]))
@example(np.array([[np.nan]], np.float32), float)
@example(np.array([[np.inf]], np.float16), int)
@example(np.array([[b"\xff"]], np.object_), int)
@example(np.array([[2**64 - 1]], np.uint64), int)
def test_scalar_gives_one_value_of_its_kind_or_a_request_error(array, kind):
    try:
        value = serving.scalar(array, "x", kind)
    except serving.RequestError as exc:
        assert exc.message.startswith("input 'x'")
        return
    assert array.size == 1 and isinstance(value, kind)
    assert not isinstance(value, float) or math.isfinite(value)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(ARRAYS, st.integers(1, 5000), st.integers(0, 5), st.one_of(st.none(), st.integers(), st.integers(-5, 300)),
       st.integers(-(2**40), 2**40), st.integers(0, 2**40))
def test_the_id_row_batch_and_length_checks_accept_or_refuse_with_a_request_error(array, vocab, rows, max_tokens,
                                                                                    n_input, n_bytes):
    for check in (lambda: serving.check_ids(array, "TOKENS_BATCH", vocab),
                  lambda: serving.check_rows(array, "IS_FINAL", rows),
                  lambda: serving.check_batch(array, "text_input"),
                  lambda: serving.check_lengths(n_input, max_tokens, 512, 256),
                  lambda: serving.check_prompt_bytes(n_bytes, serving.prompt_byte_limit(512, 8), 512)):
        try:
            check()
        except serving.RequestError as exc:
            assert exc.message and "\n" not in exc.message


JSON_OBJECTS = st.dictionaries(st.text(max_size=8), st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=5), max_size=4)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.one_of(JSON_OBJECTS, JSON_OBJECTS.map(json.dumps), st.text(max_size=20), st.none()))
@example("5")  # JSON, but not an object: once a TypeError (a crash where a request error or nothing is due)
@example("[1, 2]")
@example("null")
def test_request_parameters_are_known_or_refused(parameters):
    """What Triton's `request.parameters()` gives (a JSON object; a dict from other callers)."""
    allowed = {"text_input", "max_tokens"}
    try:
        serving.check_parameters(parameters, allowed)
    except serving.RequestError as exc:
        assert "unknown parameter" in exc.message and "known inputs: max_tokens, text_input" in exc.message


# ------------------------------------------------------------------------------ the engine itself

PROMPTS = st.one_of(st.lists(st.integers(0, family.VOCAB - 1), min_size=1, max_size=20),
                    st.lists(st.integers(-5, 10**6), max_size=20))
SAMPLING = st.builds(
    SamplingParams,
    max_new_tokens=st.one_of(st.integers(-3, 12), st.integers()),
    temperature=st.one_of(st.just(0.0), st.floats(-2, 5, allow_subnormal=False)),
    top_k=st.one_of(st.just(0), st.integers(-3, 200)),
    top_p=st.one_of(st.just(1.0), st.floats(-1, 2, allow_subnormal=False)),
    seed=st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1)),  # the range a torch generator takes
    stop=st.one_of(st.just(()), st.lists(st.text(max_size=4), max_size=3).map(tuple), st.text(max_size=3)),
    end_id=st.one_of(st.none(), st.integers(-3, 200)),
    num_draft_tokens=st.one_of(st.none(), st.integers(-3, 10)),
)


@SETTINGS
@given(PROMPTS, SAMPLING)
@example([1, 2, 3], SamplingParams(top_p=math.nan))
@example([1, 2, 3], SamplingParams(stop=("",)))
@example([], SamplingParams())
def test_the_engine_admits_or_refuses_with_a_generation_error(tiny, prompt, params):
    try:
        tiny.engine._make(prompt, params, lambda event: None)
    except GenerationError as exc:
        assert exc.message and "\n" not in exc.message
        return
    assert prompt and 1 <= params.max_new_tokens <= tiny.spec.limits.max_output_len


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(PROMPTS, SAMPLING)
def test_what_the_engine_admits_it_generates(tiny, prompt, params):
    """Admitted requests (a few tokens each) end without an error and only emit ids of the vocabulary."""
    params = dataclasses.replace(params, max_new_tokens=min(max(params.max_new_tokens, 1), 3))
    try:
        tiny.engine._make(prompt, params, lambda event: None)
    except GenerationError:
        return
    result = tiny.engine.generate(prompt, params)
    assert result.finish_reason in ("length", "eos", "stop")
    assert 1 <= len(result.tokens) <= 3 and all(0 <= t < family.VOCAB for t in result.tokens)


@pytest.mark.parametrize("params", [SamplingParams(temperature=math.nan), SamplingParams(temperature=math.inf),
                                    SamplingParams(temperature=1.0, seed=2**64)],
                         ids=["temperature-nan", "temperature-inf", "seed-2**64"])
def test_the_engine_refuses_sampling_settings_it_cannot_honour(tiny, params):
    with pytest.raises(GenerationError):
        tiny.engine._make([1, 2, 3], params, lambda event: None)


@pytest.mark.parametrize("shape", [(1, 0, 1), (1, 0, 0), (1, 1, 0)])
def test_postprocessing_refuses_empty_ids(postprocessing, shape):
    """Legal for TOKENS_BATCH's dims [-1, -1], but no first beam / id to read: a client error, not IndexError."""
    with pytest.raises(serving.RequestError, match="TOKENS_BATCH"):
        postprocessing._response(Request({"TOKENS_BATCH": np.zeros(shape, np.int32)}))


class _Sender:
    def __init__(self):
        self.sent: list[tuple] = []

    def is_cancelled(self) -> bool:
        return False

    def send(self, response=None, flags=0):
        self.sent.append((response, flags))


@pytest.mark.parametrize("in_band", [True, False])
def test_a_cut_stream_ends_in_band_inside_the_ensemble_and_postprocessing_raises_its_error(tiny, postprocessing,
                                                                                           in_band):
    """Regression: Triton 2.51's ensemble never released a request whose decoupled generation step failed while
    postprocessing still ran an earlier response of it (ensemble + postprocessing then never unloaded; the server
    hung at exit after ~1 in 3 drain-deadline cuts). Inside the ensemble (preprocessing's IN_BAND_ERRORS) the cut
    is a normal final response carrying ERROR, which postprocessing, the last step, raises as the request's error,
    with the same message and code; a direct request still gets the Triton error itself."""
    from trtspec.repository.torch_repo import ensemble_config

    gen = _load_model("tensorrt_llm.py")
    counter = types.SimpleNamespace(increment=lambda n: None)
    model = types.SimpleNamespace(boundary=None, metrics=types.SimpleNamespace(failures=counter, cancelled=counter))
    sender = _Sender()
    stream = gen.Stream(model, sender, True, (), in_band=in_band)
    cut = TritonError("generation cut after 3 tokens: the server is shutting down", code=TritonError.UNAVAILABLE)
    stream.fail(cut)
    [(response, flags)] = sender.sent
    assert flags == gen.FINAL
    if not in_band:
        assert response.error is cut and response.outputs == []
        return
    assert response.error is None
    names = ModelNames()
    steps = {s.model_name: s for s in ensemble_config(tiny.spec, names).ensemble_scheduling.step}
    assert (steps[names.preprocessing].output_map["IN_BAND_ERRORS"]
            == steps[names.generation].input_map["in_band_errors"])
    to_post = {v: k for k, v in steps[names.postprocessing].input_map.items()}  # ensemble tensor -> post input
    inputs = {to_post[steps[names.generation].output_map[t.name]]: t.array for t in response.outputs
              if steps[names.generation].output_map.get(t.name) in to_post}
    assert "ERROR" in inputs
    error = postprocessing._one(Request(inputs)).error
    assert (str(error), error.code) == (str(cut), TritonError.UNAVAILABLE)
