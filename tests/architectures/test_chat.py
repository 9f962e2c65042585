"""Chat: the tokenizer's chat template renders prompts alike in `generate --chat` (in-process), the benchmark
runners and the served preprocessing (`messages` input); every EOS of generation_config.json ends a reply."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from tests.runtime import family
from tests.test_request_properties import Request, _load_model
from trtspec.artifacts.tokenizer import chat_messages, chat_prompt_ids, render_chat
from trtspec.errors import GenerationError
from trtspec.repository import serving, textio
from trtspec.runtime import SamplingParams

TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'system' %}w90 {% endif %}{{ m['content'] }} w91 "
            "{% endfor %}{% if add_generation_prompt %}w92{% endif %}")
CHAT = [{"role": "system", "content": "w1"}, {"role": "user", "content": "w7 w8 w9"}]


@pytest.fixture(scope="module")
def chat_root(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("chat")
    family.save_llama(root / "target", seed=1)
    family.save_tokenizer(root / "target")
    tok = AutoTokenizer.from_pretrained(root / "target")
    tok.chat_template = TEMPLATE
    tok.save_pretrained(root / "target", save_jinja_files=False)
    return root


def test_rendering_and_its_one_line_errors(chat_root):
    from trtspec.artifacts.tokenizer import load_tokenizer

    tok = load_tokenizer(chat_root / "target")
    assert render_chat(tok, CHAT) == "w90 w1 w91 w7 w8 w9 w91 w92"
    assert chat_prompt_ids(tok, "w3") == tok.encode("w3 w91 w92", add_special_tokens=False)
    for bad, why in [("[", "not JSON"), ("[]", "non-empty"), ('[{"role": "x", "content": "a"}]', r"messages\[0\]"),
                     ('[{"role": "user", "content": 3}]', r"messages\[0\]"), ('{"role": "user"}', "array")]:
        with pytest.raises(GenerationError, match=why):
            chat_messages(bad)
    tok.chat_template = None
    with pytest.raises(GenerationError, match="no chat template"):
        render_chat(tok, CHAT)


def test_served_preprocessing_renders_messages_like_generate_chat(chat_root):
    from trtspec.artifacts.tokenizer import load_tokenizer

    model = object.__new__(_load_model("preprocessing.py").TritonPythonModel)
    model.tokenizer, model.add_special_tokens = load_tokenizer(chat_root / "target"), True
    model.max_input_len, model.max_output_len, model.allowed = 64, 16, set()
    model.max_input_bytes = serving.prompt_byte_limit(64, textio.max_token_bytes(model.tokenizer))
    messages = np.array([[json.dumps(CHAT).encode()]], np.object_)
    n = np.array([[8]], np.int32)
    ids, _ = model._parse(Request({"MESSAGES": messages, "REQUEST_OUTPUT_LEN": n}))
    assert ids == chat_prompt_ids(model.tokenizer, CHAT)
    with pytest.raises(serving.RequestError, match="not both"):
        model._parse(Request({"MESSAGES": messages, "QUERY": np.array([[b"w1"]], np.object_), "REQUEST_OUTPUT_LEN": n}))
    with pytest.raises(serving.RequestError, match="not JSON"):
        model._parse(Request({"MESSAGES": np.array([[b"w1 w2"]], np.object_), "REQUEST_OUTPUT_LEN": n}))
    with pytest.raises(serving.RequestError, match="'text_input' is required"):
        model._parse(Request({"REQUEST_OUTPUT_LEN": n}))


def test_generate_chat_in_process_equals_the_engine_on_the_rendered_prompt(chat_root):
    from trtspec.cli import main

    spec = family.write_spec(chat_root, "lookahead")
    r = CliRunner().invoke(main, ["generate", "--local", "-c", str(spec), "--chat", "--system", "w1", "-p", "w7 w8 w9",
                                  "-n", "12", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    engine = family.engine(chat_root, "lookahead")
    try:
        want = engine.generate(chat_prompt_ids(engine.tokenizer, CHAT), SamplingParams(max_new_tokens=12))
    finally:
        engine.close()
    assert got["tokens"] == want.tokens and got["text"] == want.text
    r = CliRunner().invoke(main, ["generate", "--local", "-c", str(spec), "--system", "w1", "-p", "w7"])
    assert r.exit_code == 64 and "--system needs --chat" in r.output


def test_every_eos_of_the_generation_config_ends_the_reply(chat_root, tmp_path):
    import shutil

    from trtspec.artifacts.hf import ModelConfig

    root = tmp_path / "m"
    shutil.copytree(chat_root / "target", root / "target")
    engine = family.engine(root, "none")
    first = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=8, end_id=-1)).tokens
    engine.close()
    gen = root / "target" / "generation_config.json"
    gen.write_text(json.dumps({**json.loads(gen.read_text()), "eos_token_id": [family.EOS, first[2]]}))
    assert ModelConfig.from_dir(root / "target").eos_token_ids == (family.EOS, first[2])
    engine = family.engine(root, "none")
    try:
        r = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=8))
    finally:
        engine.close()
    assert r.tokens == first[:3] and r.finish_reason != "length"
