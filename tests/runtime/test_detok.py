"""detok: the engine's incremental text (DecodeStream-backed) is exactly decode(all ids) after every push,
streams pieces that add up to the final text, and finds stop strings where a full search of the full text
does, for the demo family's byte-level BPE tokenizer, the tiny family's word tokenizer and a tokenizer
without a fast backend (full decodes)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from transformers import AutoTokenizer

from tests.support import MODELS, demo_models_present
from trtspec.runtime import detok
from trtspec.runtime.detok import TextStream, find_stop, shown, stop_prefix


class ByteTokenizer:
    """One token per byte, decoded like HF (incomplete or invalid UTF-8 -> U+FFFD); id 256 is special."""

    def __len__(self):
        return 257

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def tokenizers(fam):
    toks = {"tiny": AutoTokenizer.from_pretrained(str(fam / "target")), "bytes": ByteTokenizer()}
    if demo_models_present():
        toks["demo"] = AutoTokenizer.from_pretrained(str(MODELS / "target"))
    return toks


def test_fast_tokenizers_stream_incrementally(tokenizers):
    """The property below covers the DecodeStream path, not only the full-decode fallback."""
    for name, tok in tokenizers.items():
        assert (TextStream(tok)._stream is not None) == (name != "bytes"), name


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_text_stream_is_exactly_the_full_decode(tokenizers, data):
    name = data.draw(st.sampled_from(sorted(tokenizers)), label="tokenizer")
    tok = tokenizers[name]
    vocab = len(tok)
    # bias towards low ids: the demo family's byte tokens (multi-byte characters split over tokens)
    ids = data.draw(st.lists(st.one_of(st.integers(0, min(300, vocab - 1)), st.integers(0, vocab - 1)),
                             min_size=1, max_size=40), label="ids")
    full = detok.decode(tok, ids)
    windows = data.draw(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 4)), max_size=2), label="stops")
    stops = tuple(dict.fromkeys(s for s in (full[i % len(full):i % len(full) + n] for i, n in windows if full) if s))
    ts, pieces, at = TextStream(tok, stops), [], 0
    while at < len(ids):
        n = 1 if stops else data.draw(st.integers(1, 4), label="chunk")
        chunk = ids[at:at + n]
        at += len(chunk)
        hit = ts.push(chunk)
        assert ts.view == detok.decode(tok, ids[:at])
        assert ts.stop_at == find_stop(ts.view, stops)  # the full search of the full text
        done = hit or at == len(ids)
        pieces.append(ts.delta(final=done))
        if hit:
            break
    assert "".join(pieces) == ts.text
    want = detok.decode(tok, ids[:at])
    assert ts.text == (want if ts.stop_at is None else want[:ts.stop_at])


def test_shown_holds_incomplete_characters_and_partial_stop_strings():
    assert stop_prefix("x = 1\n\n", ("\n\n\n",)) == 2
    assert shown("ab\ufffd\ufffd") == "ab"
    assert shown("x = 1\n\n", ("\n\n\n",)) == "x = 1"
    assert find_stop("a stop here, then stop", ("then", "stop")) == 2
    assert find_stop("abc", ("zz",)) is None
