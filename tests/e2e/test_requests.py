"""Request validation in the served models, attacked through a real Triton server that serves ONE
deployment (lookahead: no drafter weights, the quickest to load): huge prompts, missing required
inputs, HTTP client errors, direct calls to the steps with bad inputs, and client cancellation."""

from __future__ import annotations

import json
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from tests.e2e.conftest import DEMO_MODELS, DEMO_SPECS, _tiny_specs
from trtspec.backends import build
from trtspec.builders import BuildOptions
from trtspec.check import load_spec
from trtspec.client import generate_remote
from trtspec.serve import TritonServer
from trtspec.spec import Spec

pytestmark = pytest.mark.e2e


class Served(NamedTuple):
    server: TritonServer
    spec: Spec
    prompt: str


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("requests")
    demo = (DEMO_MODELS / "MANIFEST.json").is_file()
    spec = load_spec(DEMO_SPECS / "lookahead.toml" if demo else _tiny_specs(root / "family")["lookahead"])
    result = build(spec, BuildOptions(out_engines=root / "engines", out_repo=root / "model_repository", progress=False))
    server = TritonServer(Path(result.repository), ready_timeout=300)
    server.start()
    try:
        yield Served(server, spec, "def main():\n    " if demo else "w1 w2 w3 w4")
    finally:
        code = server.stop()
    assert code == 0, f"tritonserver did not shut down cleanly (exit code {code}): {server.failure_report()}"


def _tensors(module, inputs):
    out = []
    for name, value, dtype in inputs:
        array = np.asarray(value, dtype=np.object_ if dtype == "BYTES" else None)
        t = module.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        out.append(t)
    return out


def _stream(served, model, inputs, *, cancel_after=None):
    """One streamed gRPC request; returns (text pieces, error message or None). With `cancel_after`,
    the request is cancelled after that many (non-final) responses."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(served.server.grpc_url)
    texts, cancel, count = [], False, 0
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(model, _tensors(grpcclient, inputs), enable_empty_final_response=True)
        while True:
            result, error = responses.get(timeout=120)
            if error is not None:
                return texts, error.message()
            count += 1
            out = result.as_numpy("text_output")
            if out is not None:
                texts.append(out.reshape(-1)[0].decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                return texts, None
            if cancel_after is not None and count >= cancel_after:
                cancel = True
                return texts, None
    finally:
        client.stop_stream(cancel_requests=cancel)
        client.close()


def _post(url, body: bytes):
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _metrics(served) -> dict[str, float]:
    text = urllib.request.urlopen(served.server.metrics_url, timeout=10).read().decode()
    return {name: float(value) for name, value in re.findall(r"^(spec_dec_\w+)\{[^}]*\} (\S+)$", text, re.M)}


def _one_line_without_internals(message):
    assert message and "\n" not in message.strip(), message
    assert "Traceback" not in message and "At:" not in message and ".py" not in message, message
    assert "/" not in message, message  # no file paths of the server


def test_huge_prompts_are_refused_before_tokenizing_while_others_are_served(served):
    expected = generate_remote(served.server.grpc_url, served.prompt, max_tokens=8, timeout=120).text
    huge = ("x = 1\n" * ((4 << 20) // 6)).encode()  # 4 MB: seconds of tokenizing, thousands of times the limit
    results: dict = {}

    def big(i):
        results[i] = _stream(served, "ensemble", [("text_input", [[huge]], "BYTES"),
                                                  ("max_tokens", np.array([[8]], np.int32), "INT32")])

    threads = [threading.Thread(target=big, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    short = generate_remote(served.server.grpc_url, served.prompt, max_tokens=8, timeout=120)
    for t in threads:
        t.join(timeout=120)
    assert short.text == expected and short.new_tokens == 8
    limit = served.spec.limits.max_input_len
    for texts, error in results.values():
        assert texts == [] and error is not None
        assert f"the prompt has {len(huge)} bytes" in error and f"max_input_len={limit} tokens" in error, error


def test_a_missing_required_input_is_an_error_not_an_empty_success(served):
    text = ("text_input", [[served.prompt.encode()]], "BYTES")
    tokens = ("max_tokens", np.array([[8]], np.int32), "INT32")
    stream = ("stream", np.array([[False]]), "BOOL")
    temperature = ("temperature", np.array([[0.0]], np.float32), "FP32")
    for inputs, missing in [([tokens, stream], "text_input"), ([text, stream], "max_tokens"),
                            ([text, temperature], "max_tokens"), ([temperature], "text_input")]:
        texts, error = _stream(served, "ensemble", inputs)
        assert error is not None and f"input '{missing}' is required" in error, (inputs, texts, error)
    base = f"http://{served.server.http_url}/v2/models/ensemble"
    for body, missing in [({"max_tokens": 8, "stream": False}, "text_input"),
                          ({"text_input": served.prompt, "temperature": 0.0}, "max_tokens")]:
        for endpoint in ("generate", "generate_stream"):
            status, reply = _post(f"{base}/{endpoint}", json.dumps(body).encode())
            assert status == 400 and f"input '{missing}' is required" in reply, (endpoint, body, status, reply)


def test_http_max_tokens_past_int32_is_refused_with_the_range(served):
    base = f"http://{served.server.http_url}/v2/models/ensemble"
    limit = served.spec.limits.max_output_len
    status, reply = _post(f"{base}/generate", json.dumps({"text_input": served.prompt, "max_tokens": 10**12}).encode())
    assert status == 400 and f"1..{limit}" in reply, reply
    assert str(np.int64(10**12).astype(np.int32)) not in reply  # no wrapped number (-727379968)
    status, reply = _post(f"{base}/generate", json.dumps({"text_input": served.prompt, "max_tokens": 8,
                                                          "num_draft_tokens": 10**12}).encode())
    assert status == 400 and "num_draft_tokens must be in 0.." in reply, reply


def test_direct_postprocessing_with_bad_ids_fails_in_one_line(served):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    length = ("SEQUENCE_LENGTH", np.array([[1]], np.int32), "INT32")
    bad = {
        "negative id": ([("TOKENS_BATCH", np.array([[[-3]]], np.int32), "INT32"), length], "token id -3"),
        "id past the vocab": ([("TOKENS_BATCH", np.array([[[10**6]]], np.int32), "INT32"), length],
                              "token id 1000000"),
        "length past the ids": ([("TOKENS_BATCH", np.array([[[1, 2]]], np.int32), "INT32"),
                                 ("SEQUENCE_LENGTH", np.array([[9]], np.int32), "INT32")], "SEQUENCE_LENGTH 9"),
        "no ids": ([length, ("IS_FINAL", np.array([[True]]), "BOOL")], "input 'TOKENS_BATCH' is required"),
    }
    grpc = grpcclient.InferenceServerClient(served.server.grpc_url)
    http = httpclient.InferenceServerClient(served.server.http_url)
    try:
        for what, (inputs, needle) in bad.items():
            for module, client, status in ((grpcclient, grpc, "StatusCode.INVALID_ARGUMENT"),
                                           (httpclient, http, "400")):
                with pytest.raises(InferenceServerException) as info:
                    client.infer("postprocessing", _tensors(module, inputs))
                message = info.value.message()
                assert needle in message and str(info.value.status()) == status, (what, info.value.status(), message)
                _one_line_without_internals(message)
        ok = grpc.infer("postprocessing", _tensors(grpcclient, [("TOKENS_BATCH", np.array([[[5]]], np.int32), "INT32"),
                                                                length]))
        assert ok.as_numpy("OUTPUT").shape == (1, 1)  # and the model still serves
    finally:
        grpc.close()
        http.close()


def test_direct_generation_requests_are_checked(served):
    ids = ("input_ids", np.array([[5, 6, 7]], np.int32), "INT32")
    n = ("input_lengths", np.array([[3]], np.int32), "INT32")
    out = ("request_output_len", np.array([[4]], np.int32), "INT32")
    stream = ("streaming", np.array([[True]]), "BOOL")
    for inputs, needle in [([n, out, stream], "input 'input_ids' is required"),
                           ([ids, ("input_lengths", np.array([[-1]], np.int32), "INT32"), out], "input_lengths -1"),
                           ([ids, n, out, ("temperature", np.array([[np.nan]], np.float32), "FP32")], "finite")]:
        texts, error = _stream(served, "tensorrt_llm", inputs)
        assert error is not None and needle in error, (inputs, error)
        _one_line_without_internals(error)


def test_a_cancelled_direct_request_stops_and_counts_as_cancelled(served):
    max_tokens = served.spec.limits.max_output_len
    before = _metrics(served)
    texts, error = _stream(served, "tensorrt_llm", [
        ("input_ids", np.array([[5, 6, 7, 8]], np.int32), "INT32"),
        ("input_lengths", np.array([[4]], np.int32), "INT32"),
        ("request_output_len", np.array([[max_tokens]], np.int32), "INT32"),
        ("end_id", np.array([[-1]], np.int32), "INT32"),  # no EOS: only the cancellation ends it early
        ("streaming", np.array([[True]]), "BOOL")], cancel_after=1)
    assert error is None
    cancelled = "spec_dec_requests_cancelled_total"
    deadline = time.monotonic() + 60  # a bounded wait for the engine's next step, not a timing assertion
    while _metrics(served).get(cancelled, 0) <= before.get(cancelled, 0):
        assert time.monotonic() < deadline, "the cancelled request was never counted as cancelled"
        time.sleep(0.2)
    after = _metrics(served)
    assert after["spec_dec_requests_total"] == before["spec_dec_requests_total"]  # not completed
    assert after["spec_dec_request_failures_total"] == before["spec_dec_request_failures_total"]
    assert after["spec_dec_generated_tokens_total"] - before["spec_dec_generated_tokens_total"] < max_tokens
