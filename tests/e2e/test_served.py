"""Against ONE real Triton server holding all four methods (see conftest.py)."""

from __future__ import annotations

import json
import queue
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from tests.e2e.conftest import METHODS
from trtspec.client import generate_remote
from trtspec.errors import ClientError
from trtspec.repository import pbtxt

pytestmark = pytest.mark.e2e
MAX_TOKENS = 24


def _remote(e2e, method, prompt, **kw):
    kw.setdefault("max_tokens", MAX_TOKENS)
    return generate_remote(e2e.server.grpc_url, prompt, model=e2e.deployments[method].ensemble, timeout=120, **kw)


def test_the_whole_repository_loads(e2e):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(e2e.server.grpc_url)
    try:
        index = client.get_model_repository_index(headers=e2e.server.admin_headers("grpc"), as_json=True)
        models = {m["name"]: m for m in index["models"]}
        assert len(models) == 2 + 2 * (len(METHODS) + 1)  # + the routed deployment (e2e.routed)
        for name, model in models.items():
            assert model.get("state") == "READY", (name, model)
            assert pbtxt.read_config(e2e.server.model_repository / name / "config.pbtxt").name == name
    finally:
        client.close()


@pytest.mark.parametrize("method", METHODS)
def test_greedy_served_text_equals_inprocess_plain_decoding(e2e, local_engines, method):
    from trtspec.runtime import SamplingParams

    engine = local_engines(method)
    for prompt in e2e.prompts[:2]:
        plain = engine.generate(prompt, SamplingParams(max_new_tokens=MAX_TOKENS, num_draft_tokens=0))
        pieces = []
        streamed = _remote(e2e, method, prompt, stream=True, on_text=pieces.append)
        whole = _remote(e2e, method, prompt, stream=False)
        no_spec = _remote(e2e, method, prompt, stream=True, num_draft_tokens=0)
        assert streamed.text == whole.text == no_spec.text == plain.text
        assert "".join(pieces) == streamed.text
        assert streamed.new_tokens == len(plain.tokens)
        if len(plain.tokens) > 2:
            assert streamed.responses > 1 and whole.responses == 1
        assert streamed.ttft_seconds is not None and streamed.ttft_seconds <= streamed.seconds
        assert 0 <= streamed.total_accepted_draft_tokens <= streamed.total_draft_tokens
        assert 0.0 <= streamed.acceptance_rate <= 1.0
        assert no_spec.total_draft_tokens == 0 and no_spec.acceptance_rate == 0.0
        assert no_spec.tokens_per_step == pytest.approx(1.0)


def test_speculation_really_happens(e2e):
    result = _remote(e2e, "draft-model", e2e.prompts[0], max_tokens=32)
    assert result.total_draft_tokens > 0 and result.total_accepted_draft_tokens > 0
    assert result.tokens_per_step > 1.0
    assert result.acceptance_rate == pytest.approx(result.total_accepted_draft_tokens / result.total_draft_tokens,
                                                   rel=1e-5)


def test_stop_string_and_sampling_inputs(e2e, local_engines):
    from trtspec.runtime import SamplingParams

    engine = local_engines("eagle")
    prompt = e2e.prompts[0]
    full = engine.generate(prompt, SamplingParams(max_new_tokens=MAX_TOKENS)).text
    if len(full.strip()) < 6:
        pytest.skip(f"the model's greedy continuation is too short for a stop string: {full!r}")
    middle = len(full) // 2
    stop = full[middle:middle + 3]
    expected = engine.generate(prompt, SamplingParams(max_new_tokens=MAX_TOKENS, stop=(stop,))).text
    for stream in (False, True):
        assert _remote(e2e, "eagle", prompt, stream=stream, stop=[stop]).text == expected
    a = _remote(e2e, "eagle", prompt, temperature=0.8, top_k=20, top_p=0.9, seed=1234)
    b = _remote(e2e, "eagle", prompt, temperature=0.8, top_k=20, top_p=0.9, seed=1234)
    assert a.text == b.text and a.new_tokens > 0  # seeded sampling is reproducible


def test_concurrent_requests_are_batched_and_exact(e2e):
    jobs = [(m, p) for m in ("draft-model", "medusa") for p in e2e.prompts]
    expected = {job: _remote(e2e, *job).text for job in jobs}
    results: dict = {}

    def run(job):
        try:
            results[job] = _remote(e2e, *job).text
        except Exception as exc:  # noqa: BLE001 - reported below
            results[job] = exc

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert results == expected


def _raw_stream(e2e, model, inputs, parameters=None):
    """Send one request with hand-made inputs; returns (texts, error message or None)."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(e2e.server.grpc_url)
    tensors = []
    for name, array, dtype in inputs:
        t = grpcclient.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        tensors.append(t)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(model, tensors, enable_empty_final_response=True, parameters=parameters)
        texts = []
        while True:
            result, error = responses.get(timeout=60)
            if error is not None:
                return texts, error.message()
            out = result.as_numpy("text_output")
            if out is not None:
                texts.append(out.reshape(-1)[0].decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                return texts, None
    finally:
        client.stop_stream()
        client.close()


def test_bad_requests_fail_only_that_request(e2e):
    ens = e2e.deployments["eagle"].ensemble
    limit = e2e.deployments["eagle"].spec.limits
    text = np.array([[e2e.prompts[0].encode()]], dtype=np.object_)
    bad = {
        "empty prompt": ([("text_input", np.array([[b""]], dtype=np.object_), "BYTES"),
                          ("max_tokens", np.array([[8]], dtype=np.int32), "INT32")], None, "empty"),
        "zero max_tokens": ([("text_input", text, "BYTES"), ("max_tokens", np.array([[0]], dtype=np.int32), "INT32")],
                            None, "max_tokens"),
        "max_tokens over the limit": ([("text_input", text, "BYTES"),
                                       ("max_tokens", np.array([[limit.max_output_len + 1]], dtype=np.int32), "INT32")],
                                      None, "max_output_len"),
        "prompt too long": ([("text_input", np.array([[e2e.long_prompt.encode()]], dtype=np.object_), "BYTES"),
                             ("max_tokens", np.array([[8]], dtype=np.int32), "INT32")], None, "max_input_len"),
        "wrong dtype": ([("text_input", text, "BYTES"), ("max_tokens", np.array([[8.0]], dtype=np.float32), "FP32")],
                        None, "data-type is 'FP32'"),
        "unknown input": ([("text_input", text, "BYTES"), ("max_tokens", np.array([[8]], dtype=np.int32), "INT32"),
                           ("bogus", np.array([[1]], dtype=np.int32), "INT32")], None, "bogus"),
        "unknown parameter": ([("text_input", text, "BYTES"), ("max_tokens", np.array([[8]], dtype=np.int32), "INT32")],
                              {"bogus": 1}, "unknown parameter 'bogus'"),
        "too many draft tokens": ([("text_input", text, "BYTES"),
                                   ("max_tokens", np.array([[8]], dtype=np.int32), "INT32"),
                                   ("num_draft_tokens", np.array([[99]], dtype=np.int32), "INT32")], None,
                                  "num_draft_tokens"),
    }
    good = _remote(e2e, "eagle", e2e.prompts[1])
    outcome: dict = {}

    def in_flight():  # a good request running while the bad ones arrive
        outcome["text"] = _remote(e2e, "eagle", e2e.prompts[1]).text

    t = threading.Thread(target=in_flight)
    t.start()
    for what, (inputs, params, needle) in bad.items():
        texts, error = _raw_stream(e2e, ens, inputs, params)
        assert error is not None and needle in error, (what, error)
        assert "\n" not in error.strip(), what
    t.join(timeout=120)
    assert outcome["text"] == good.text
    with pytest.raises(ClientError, match="server error: .*empty"):
        _remote(e2e, "eagle", "")
    assert _remote(e2e, "eagle", e2e.prompts[1]).text == good.text  # still serving


def _post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_http_generate_endpoints(e2e):
    ens = e2e.deployments["medusa"].ensemble
    base = f"http://{e2e.server.http_url}/v2/models/{ens}"
    prompt = e2e.prompts[0]
    expected = _remote(e2e, "medusa", prompt)
    status, body = _post(f"{base}/generate", {"text_input": prompt, "max_tokens": MAX_TOKENS})
    assert status == 200, body
    data = json.loads(body)
    assert data["text_output"] == expected.text
    assert data["total_draft_tokens"] == expected.total_draft_tokens
    status, body = _post(f"{base}/generate_stream", {"text_input": prompt, "max_tokens": MAX_TOKENS, "stream": True})
    assert status == 200, body
    events = [json.loads(line[len("data: "):]) for line in body.splitlines() if line.startswith("data: ")]
    assert len(events) > 1
    assert "".join(e["text_output"] for e in events) == expected.text
    status, body = _post(f"{base}/generate", {"text_input": prompt, "max_tokens": MAX_TOKENS, "bogus": 1})
    assert status == 400 and "unknown parameter 'bogus'" in body
    status, body = _post(f"{base}/generate", {"text_input": prompt, "max_tokens": -1})
    assert status == 400 and "max_tokens" in body


def test_spec_dec_metrics_increase(e2e):
    method = "draft-model"
    before = e2e.metrics()
    result = _remote(e2e, method, e2e.prompts[2])
    after = e2e.metrics()

    def delta(name):
        return after[(name, method)] - before.get((name, method), 0.0)

    assert delta("spec_dec_requests_total") == 1
    assert delta("spec_dec_generated_tokens_total") == result.new_tokens
    assert delta("spec_dec_draft_tokens_total") == result.total_draft_tokens > 0
    assert delta("spec_dec_accepted_tokens_total") == result.total_accepted_draft_tokens
    assert delta("spec_dec_steps_total") == result.steps
    assert delta("spec_dec_draft_latency_seconds_count") == result.steps
    assert delta("spec_dec_verify_latency_seconds_count") == result.steps
    assert delta("spec_dec_verify_latency_seconds_sum") > 0
    assert delta("spec_dec_prompt_tokens_total") > 0
    assert 0 <= after[("spec_dec_acceptance_rate", method)] <= 1
    assert after[("spec_dec_tokens_per_step", method)] >= 1
    for m in METHODS:  # every generation model exports its families, labelled with its method
        assert ("spec_dec_draft_tokens_total", m) in after
