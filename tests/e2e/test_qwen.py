"""The real same-family pair of `make qwen` served end to end (`make test-qwen`; skipped until the pair is imported):
Qwen2.5-Coder-1.5B-Instruct drafted by its 0.5B sibling (examples/qwen/draft-model.toml), built and served by the
bundled Triton, streams a chat over gRPC (the `messages` input, rendered by the server's chat template, speculating
with the drafter) whose text is the greedy text of in-process plain decoding of the same weights. The server's
resident memory with both models loaded (tritonserver + its Python-backend stubs) is printed for docs/qwen.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import ROOT

TARGET = ROOT / "examples" / "models" / "qwen2.5-coder-1.5b-instruct"
DRAFT = ROOT / "examples" / "models" / "qwen2.5-coder-0.5b-instruct"
SPEC = ROOT / "examples" / "qwen" / "draft-model.toml"
CHAT = [{"role": "user", "content": "Write a Python function that returns the squares of the even numbers in a list."}]
MAX_TOKENS = 64

pytestmark = [pytest.mark.qwen, pytest.mark.e2e,
              pytest.mark.skipif(not (TARGET / "trtspec.import.json").is_file()
                                 or not (DRAFT / "trtspec.import.json").is_file(),
                                 reason="the Qwen pair is not imported (make qwen)")]


def test_a_chat_streamed_by_the_served_pair_equals_inprocess_plain_decoding(tmp_path, capsys):
    import sys

    from trtspec import methods
    from trtspec.artifacts.tokenizer import chat_prompt_ids
    from trtspec.backends import build
    from trtspec.builders import BuildOptions
    from trtspec.check import load_spec
    from trtspec.client import generate_remote
    from trtspec.repository.serving import load_engine_spec
    from trtspec.runtime import SamplingParams
    from trtspec.serve import TritonServer

    sys.path.insert(0, str(ROOT))
    from bench.soak import server_rss

    spec = load_spec(SPEC)
    assert methods.check_pair(spec).problems == []
    result = build(spec, BuildOptions(out_engines=tmp_path / "engines", out_repo=tmp_path / "model_repository",
                                      progress=False))
    engine = methods.engine(load_engine_spec(Path(result.engines["target"]).parent))
    try:  # plain decoding of the weights the server loads (freed before the server starts)
        plain = engine.generate(chat_prompt_ids(engine.tokenizer, CHAT),
                                SamplingParams(max_new_tokens=MAX_TOKENS, num_draft_tokens=0))
    finally:
        engine.close()
        del engine
    assert len(plain.tokens) > 16 and "def " in plain.text

    server = TritonServer(Path(result.repository), ready_timeout=600)
    server.start()
    try:
        pieces: list[str] = []
        streamed = generate_remote(server.grpc_url, "", messages=CHAT, max_tokens=MAX_TOKENS, stream=True,
                                   on_text=pieces.append, timeout=600)
        rss_mb, procs = server_rss(server)
        assert streamed.text == plain.text and "".join(pieces) == plain.text
        assert streamed.new_tokens == len(plain.tokens) and streamed.responses > 1
        assert streamed.total_draft_tokens > 0 and streamed.total_accepted_draft_tokens > 0  # the drafter drafted
        with capsys.disabled():
            print(f"\nserved Qwen pair: {streamed.new_tokens} tokens in {streamed.seconds:.1f} s "
                  f"({streamed.tokens_per_second:.1f} tok/s), tau {streamed.tokens_per_step:.2f}, "
                  f"acceptance {streamed.acceptance_rate:.2f}; server RSS {rss_mb / 1024:.2f} GB "
                  f"over {procs} processes (tritonserver + stubs)")
    finally:
        code = server.stop()
    assert code == 0, server.failure_report()
