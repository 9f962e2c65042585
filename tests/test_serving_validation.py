"""Request validation helpers of the served models (plain Python, no Triton): the prompt byte bound,
token-id and shape checks, one-line errors that never leak a traceback, and the ensemble wiring that
makes `preprocessing` run for every request (Triton 2.51 otherwise answers a request missing a
required input with an empty success)."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

from tests.e2e.conftest import DEMO_SPECS
from trtspec.check import load_spec
from trtspec.repository import serving, textio
from trtspec.repository.torch_repo import ModelNames, ensemble_config, preprocessing_config


class Tokenizer:
    """Three pieces: SentencePiece-style strings whose UTF-8 length is what they stand for."""

    name_or_path = ""
    pieces = ["a", "\u2581hello", "\u00e9t\u00e9"]

    def __len__(self):
        return len(self.pieces)

    def convert_ids_to_tokens(self, ids):
        return [self.pieces[i] for i in ids]


def test_the_prompt_byte_bound_comes_from_max_input_len_and_the_longest_token():
    tok = Tokenizer()
    assert textio.max_token_bytes(tok) == len("\u2581hello".encode())  # 8 bytes
    limit = serving.prompt_byte_limit(512, textio.max_token_bytes(tok))
    assert limit == 512 * serving.MIN_BYTES_PER_TOKEN  # a generous floor per token
    assert serving.prompt_byte_limit(10, 100) == 1000
    serving.check_prompt_bytes(limit, limit, 512)
    with pytest.raises(serving.RequestError, match=f"has {limit + 1} bytes, more than the {limit} bytes allowed "
                                                   "for max_input_len=512 tokens"):
        serving.check_prompt_bytes(limit + 1, limit, 512)


def test_the_vocab_bound_includes_a_padded_model_vocab(tmp_path):
    tok = Tokenizer()
    assert textio.vocab_bound(tok) == 3
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 64}))
    tok.name_or_path = str(tmp_path)
    assert textio.vocab_bound(tok) == 64


def test_ids_shapes_and_values_are_checked():
    serving.check_ids(np.array([[[0, 5, 9]]], np.int32), "TOKENS_BATCH", 10)
    with pytest.raises(serving.RequestError, match="token id -1, outside 0..9"):
        serving.check_ids(np.array([[[3, -1]]], np.int32), "TOKENS_BATCH", 10)
    with pytest.raises(serving.RequestError, match="token id 10, outside 0..9"):
        serving.check_ids(np.array([[[10]]], np.int32), "TOKENS_BATCH", 10)
    with pytest.raises(serving.RequestError, match="integer token ids"):
        serving.check_ids(np.array([[[1.5]]], np.float32), "TOKENS_BATCH", 10)
    with pytest.raises(serving.RequestError, match="expected 2 row"):
        serving.check_rows(np.zeros((1, 1)), "IS_FINAL", 2)
    with pytest.raises(serving.RequestError, match="input 'max_tokens' is required"):
        serving.require(None, "max_tokens")
    with pytest.raises(serving.RequestError, match="finite"):
        serving.scalar(np.array([[np.nan]], np.float32), "temperature", float)
    assert serving.scalar(np.array([[b"7"]], dtype=np.object_), "n", int) == 7
    with pytest.raises(serving.RequestError, match="must be int"):
        serving.scalar(np.array([[b"seven"]], dtype=np.object_), "n", int)


def test_a_wrapped_max_tokens_is_refused_by_its_range_not_its_value():
    wrapped = int(np.int64(10**12).astype(np.int32))  # what Triton's HTTP JSON parser makes of 1e12 for INT32
    with pytest.raises(serving.RequestError) as info:
        serving.check_lengths(3, wrapped, 512, 256)
    assert "1..256" in info.value.message and str(wrapped) not in info.value.message


class FakePbUtils:
    """The parts of triton_python_backend_utils that serving.triton_error uses."""

    def __init__(self):
        self.logged: list[str] = []
        self.Logger = types.SimpleNamespace(log_error=self.logged.append)

    class TritonError:
        INTERNAL, INVALID_ARG = "INTERNAL", "INVALID_ARG"

        def __init__(self, message, code=INTERNAL):
            self.message, self.code = message, code


def test_bad_requests_are_client_errors_and_bugs_are_logged_not_shown():
    pb = FakePbUtils()
    error = serving.triton_error(pb, serving.RequestError("input 'QUERY'\nis required"), "preprocessing")
    assert (error.message, error.code) == ("input 'QUERY' is required", "INVALID_ARG") and pb.logged == []
    try:
        open("/srv/secret/engine/tokenizer.json")
    except OSError as exc:
        error = serving.triton_error(pb, exc, "postprocessing")
    assert error.code == "INTERNAL"
    assert error.message == "internal error in postprocessing (FileNotFoundError); the server log has the details"
    assert len(pb.logged) == 1 and "Traceback" in pb.logged[0] and "/srv/secret" in pb.logged[0]


def test_every_ensemble_input_reaches_preprocessing_which_takes_them_all_as_optional():
    spec = load_spec(DEMO_SPECS / "lookahead.toml")
    names = ModelNames()
    ens, pre = ensemble_config(spec, names), preprocessing_config(spec, names, "../../engines/x")
    step = next(s for s in ens.ensemble_scheduling.step if s.model_name == names.preprocessing)
    assert sorted(step.input_map.values()) == sorted(t.name for t in ens.input)
    assert all(t.optional for t in ens.input) and all(t.optional for t in pre.input)
    types_ = {t.name: t.data_type for t in pre.input}
    for inner, outer in step.input_map.items():
        assert types_[inner] == next(t.data_type for t in ens.input if t.name == outer)
