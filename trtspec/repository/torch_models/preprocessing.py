"""`preprocessing`: text -> token ids (Triton Python backend; copied into preprocessing/1/model.py).

Inputs (as in tensorrtllm_backend): QUERY STRING [1], REQUEST_OUTPUT_LEN INT32 [1]; or, instead of QUERY,
MESSAGES STRING [1]: a chat, the JSON array [{"role": "user", "content": "..."}, ...], which is rendered
with the tokenizer's chat template (generation prompt added, encoded without adding special tokens: the
template writes them), so clients need no tokenizer; and, read for nothing but their presence, the
ensemble's other inputs (STREAM, TEMPERATURE, ... see torch_repo.PRESENCE_INPUTS; the generation model
takes and checks their values).
Outputs: INPUT_ID INT32 [-1], REQUEST_INPUT_LEN INT32 [1], REQUEST_OUTPUT_LEN INT32 [1], and IN_BAND_ERRORS
BOOL [1] (always true): it tells the generation model that it runs inside the ensemble, so that it ends a
stream it has to cut with an in-band error that `postprocessing` raises (see tensorrt_llm.py, Stream.fail).
Bad requests (a missing text_input or max_tokens, empty prompt, prompt over max_input_len, max_tokens
<= 0 or over max_output_len, unknown request parameters) fail that request only, with a one-line
message. Every input is optional in the configs and every ensemble input reaches this step, so it runs
for any request and names what is missing: Triton 2.51 admits a request that lacks a required input but
carries an optional one, and its ensemble then never runs the step and answers with an empty success.
The prompt's UTF-8 size is bounded before it is tokenized (`max_input_bytes`, derived from
max_input_len and the longest token), so a huge prompt is refused at once, not after seconds of
tokenizing that hold up every request queued behind it.
"""


import functools

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.artifacts.tokenizer import chat_messages, render_chat
from trtspec.repository import serving, textio

_input = functools.partial(serving.input_array, pb_utils)  # (request, name) -> numpy array or None


class TritonPythonModel:
    def initialize(self, args):
        serving.watch_server()  # the stub exits with its server (no orphan after a kill -9)
        params, self.tokenizer = serving.model_tokenizer(args)
        self.add_special_tokens = params.get("add_special_tokens", "true").lower() == "true"
        self.max_input_len = serving.int_param(params, "max_input_len", 512)
        self.max_output_len = serving.int_param(params, "max_output_len", 256)
        self.max_input_bytes = serving.int_param(params, "max_input_bytes", 0) or serving.prompt_byte_limit(
            self.max_input_len, textio.max_token_bytes(self.tokenizer))
        self.allowed = set(filter(None, params.get("request_inputs", "").split(",")))

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        try:
            ids, max_tokens = self._parse(request)
        except Exception as exc:  # a bad request, or a bug: one line to the client either way
            return pb_utils.InferenceResponse(output_tensors=[], error=serving.triton_error(pb_utils, exc,
                                                                                           "preprocessing"))
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("INPUT_ID", np.asarray([ids], dtype=np.int32)),
            pb_utils.Tensor("REQUEST_INPUT_LEN", np.asarray([[len(ids)]], dtype=np.int32)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", np.asarray([[max_tokens]], dtype=np.int32)),
            pb_utils.Tensor("IN_BAND_ERRORS", np.asarray([[True]], dtype=np.bool_)),
        ])

    def _parse(self, request):
        serving.check_parameters(request.parameters(), self.allowed)
        query, messages = _input(request, "QUERY"), _input(request, "MESSAGES")
        if query is not None and messages is not None:
            raise serving.RequestError("send either 'text_input' or 'messages' (a chat), not both")
        name = "text_input" if messages is None else "messages"
        query = serving.require(query if messages is None else messages, name)
        out_len = serving.require(_input(request, "REQUEST_OUTPUT_LEN"), "max_tokens")
        serving.check_batch(query, name)
        max_tokens = serving.scalar(out_len, "max_tokens", int)
        if query.size == 1:  # (scalar() below reports any other shape)
            raw = query.reshape(-1)[0]
            size = len(raw) if isinstance(raw, bytes) else len(str(raw).encode("utf-8"))
            serving.check_prompt_bytes(size, self.max_input_bytes, self.max_input_len)
        text = serving.scalar(query, name, str)
        if messages is not None:
            text = render_chat(self.tokenizer, chat_messages(text, serving.RequestError), serving.RequestError)
        if not text.strip():
            raise serving.RequestError("the prompt is empty")
        serving.check_lengths(1, max_tokens, self.max_input_len, self.max_output_len)  # before tokenizing
        ids = textio.encode(self.tokenizer, text, self.add_special_tokens and messages is None)
        serving.check_lengths(len(ids), max_tokens, self.max_input_len, self.max_output_len)
        return ids, max_tokens
