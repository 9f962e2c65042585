"""`preprocessing`: text -> token ids (Triton Python backend; copied into preprocessing/1/model.py).

Inputs (as in tensorrtllm_backend): QUERY STRING [1], REQUEST_OUTPUT_LEN INT32 [1].
Outputs: INPUT_ID INT32 [-1], REQUEST_INPUT_LEN INT32 [1], REQUEST_OUTPUT_LEN INT32 [1].
Bad requests (empty prompt, prompt over max_input_len, max_tokens <= 0 or over max_output_len,
unknown request parameters) fail that request only, with a one-line message.
"""


import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.repository import serving, textio


class TritonPythonModel:
    def initialize(self, args):
        params, self.tokenizer = serving.model_tokenizer(args)
        self.add_special_tokens = params.get("add_special_tokens", "true").lower() == "true"
        self.max_input_len = serving.int_param(params, "max_input_len", 512)
        self.max_output_len = serving.int_param(params, "max_output_len", 256)
        self.allowed = set(filter(None, params.get("request_inputs", "").split(",")))

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        try:
            serving.check_parameters(request.parameters(), self.allowed)
            query = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()
            out_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy()
            serving.check_batch(query, "text_input")
            text = serving.scalar(query, "text_input", str)
            max_tokens = serving.scalar(out_len, "max_tokens", int)
            ids = textio.encode(self.tokenizer, text, self.add_special_tokens) if text.strip() else []
            serving.check_lengths(len(ids), max_tokens, self.max_input_len, self.max_output_len)
        except serving.RequestError as exc:
            return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc)))
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("INPUT_ID", np.asarray([ids], dtype=np.int32)),
            pb_utils.Tensor("REQUEST_INPUT_LEN", np.asarray([[len(ids)]], dtype=np.int32)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", np.asarray([[max_tokens]], dtype=np.int32)),
        ])
