"""`postprocessing`: token ids -> text (Triton Python backend; copied into postprocessing/1/model.py).

Stateless and exact for streaming: each response of the generation model carries the newly
accepted ids (TOKENS_BATCH) and a detokenization context (CONTEXT_IDS); the text output is what
those ids add, holding back an incomplete UTF-8 character until it is complete or the request
ends (IS_FINAL). With stop strings (STOP_WORDS) a tail that may grow into one is held back as well,
and the final text loses its last STOP_TRIM characters (the stop string and what follows, as the
engine trims them). See trtspec/runtime/detok.py.
The speculative-decoding counters pass through unchanged (one ensemble response per step).
ERROR (a JSON {"code", "message"}, empty when none) is the generation model's in-band error: a stream it had
to cut (drain deadline, internal failure) ends with a final response that carries it, and this step raises
it as the request's error, so that the error reaches the client from the ensemble's last step, in order
(see tensorrt_llm.py, Stream.fail).
Inputs are checked (at least one id, ids in 0..vocab-1, lengths within the ids, one row per request), so a
direct call with bad ids gets a one-line error, never a tokenizer traceback.
"""


import functools
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.repository import serving, textio
from trtspec.runtime import detok

PASS_THROUGH = {  # input -> (output, dtype)
    "ACCEPTANCE_RATE": ("OUT_ACCEPTANCE_RATE", np.float32),
    "TOTAL_ACCEPTED_DRAFT_TOKENS": ("OUT_TOTAL_ACCEPTED_DRAFT_TOKENS", np.int32),
    "TOTAL_DRAFT_TOKENS": ("OUT_TOTAL_DRAFT_TOKENS", np.int32),
    "NUM_OUTPUT_TOKENS": ("OUT_NUM_OUTPUT_TOKENS", np.int32),
    "NUM_STEPS": ("OUT_NUM_STEPS", np.int32),
}


_input = functools.partial(serving.input_array, pb_utils)  # (request, name) -> numpy array or None


def in_band_error(value):
    """The TritonError that the generation model put in its ERROR output, or None."""
    raw = value.reshape(-1)[0] if value is not None and value.size else b""
    if not raw:
        return None
    try:
        error = json.loads(raw)
        code = getattr(pb_utils.TritonError, str(error["code"]), pb_utils.TritonError.INTERNAL)
        return pb_utils.TritonError(str(error["message"]), code=code)
    except (ValueError, KeyError, TypeError):
        return pb_utils.TritonError("generation failed (malformed in-band error)", code=pb_utils.TritonError.INTERNAL)


class TritonPythonModel:
    def initialize(self, args):
        serving.watch_server()  # the stub exits with its server (no orphan after a kill -9)
        _, self.tokenizer = serving.model_tokenizer(args)
        self.vocab = textio.vocab_bound(self.tokenizer)

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        error = in_band_error(_input(request, "ERROR"))
        if error is not None:
            return pb_utils.InferenceResponse(output_tensors=[], error=error)
        try:
            return self._response(request)
        except Exception as exc:  # a bad request, or a bug: one line to the client either way
            return pb_utils.InferenceResponse(output_tensors=[], error=serving.triton_error(pb_utils, exc,
                                                                                           "postprocessing"))

    def _response(self, request):
        tokens = serving.require(_input(request, "TOKENS_BATCH"), "TOKENS_BATCH")  # [batch, beam, n]
        lengths = _input(request, "SEQUENCE_LENGTH")       # [batch, beam]
        context = _input(request, "CONTEXT_IDS")           # [batch, c]
        final = _input(request, "IS_FINAL")                # [batch, 1]
        trim = _input(request, "STOP_TRIM")                # [batch, 1]
        stop = _input(request, "STOP_WORDS")               # [batch, n]
        if tokens.ndim != 3:
            raise serving.RequestError(f"input 'TOKENS_BATCH' must be [batch, beam, n], got {list(tokens.shape)}")
        if 0 in tokens.shape:  # legal for its dims [-1, -1], but there is no first beam to read (the generation
            # model sends at least one id per response)
            raise serving.RequestError(f"input 'TOKENS_BATCH' of shape {list(tokens.shape)} holds no ids: "
                                       "send at least one beam of at least one id per request")
        batch = tokens.shape[0]
        serving.check_ids(tokens, "TOKENS_BATCH", self.vocab)
        serving.check_ids(context, "CONTEXT_IDS", self.vocab)
        for name, value in (("SEQUENCE_LENGTH", lengths), ("CONTEXT_IDS", context), ("IS_FINAL", final),
                            ("STOP_TRIM", trim), ("STOP_WORDS", stop)):
            serving.check_rows(value, name, batch)
        texts = []
        for b in range(batch):
            n = int(lengths[b].reshape(-1)[0]) if lengths is not None and lengths[b].size else tokens.shape[-1]
            if not 0 <= n <= tokens.shape[-1]:
                raise serving.RequestError(f"SEQUENCE_LENGTH {n} is outside 0..{tokens.shape[-1]} "
                                           "(the ids in TOKENS_BATCH)")
            delta = tokens[b].reshape(-1, tokens.shape[-1])[0][:n].tolist()
            ctx = context[b].reshape(-1).tolist() if context is not None else []
            is_final = bool(final[b].reshape(-1)[0]) if final is not None and final[b].size else True
            cut = max(0, int(trim[b].reshape(-1)[0])) if trim is not None and trim[b].size else 0
            words = [w.decode("utf-8", errors="replace") for w in stop[b].reshape(-1) if w] if stop is not None else []
            texts.append(detok.text_delta(self.tokenizer, ctx, delta, is_final, cut, words).encode("utf-8"))
        outputs = [pb_utils.Tensor("OUTPUT", np.asarray(texts, dtype=np.object_).reshape(batch, 1))]
        for name, (out, dtype) in PASS_THROUGH.items():
            value = _input(request, name)
            if value is None:
                value = np.zeros((batch, 1), dtype=dtype)
            elif value.size != batch:
                raise serving.RequestError(f"input '{name}' must hold one value per request, got {list(value.shape)}")
            outputs.append(pb_utils.Tensor(out, value.astype(dtype).reshape(batch, 1)))
        return pb_utils.InferenceResponse(output_tensors=outputs)
