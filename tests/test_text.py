from trtspec.text import TextStream


class ByteTokenizer:
    """Each token is one UTF-8 byte; decoding replaces incomplete sequences like HF does."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_partial_utf8_is_held_back_until_complete():
    text = "naïve → ok 😀"
    ids = list(text.encode())
    stream = TextStream(ByteTokenizer())
    pieces = [stream.push([i]) for i in ids]
    assert "".join(pieces) + stream.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    # the 4-byte emoji arrives as one piece, only when its last byte does
    assert pieces[-1] == "😀" and pieces[-2] == pieces[-3] == pieces[-4] == ""


def test_flush_emits_a_dangling_partial_character():
    stream = TextStream(ByteTokenizer())
    assert stream.push(list("é".encode())[:1]) == ""
    assert stream.flush() == "\ufffd"
