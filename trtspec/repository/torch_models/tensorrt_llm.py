"""`tensorrt_llm` for the torch runtime: speculative decoding with continuous batching
(Triton Python backend, decoupled; copied into tensorrt_llm/1/model.py).

It mirrors the tensorrtllm_backend model's name and I/O so that ensembles and clients port
unchanged: inputs input_ids, input_lengths, request_output_len, end_id, temperature,
runtime_top_k, runtime_top_p, seed, streaming, plus stop_words (strings) and num_draft_tokens
(0 = no speculation); outputs output_ids / sequence_length (the ids accepted since the previous
response; all of them when not streaming), context_ids, is_final, stop_trim and stop_words_out (for
exact streaming detokenization in `postprocessing`, see trtspec/repository/textio.py) and the per-request
counters acceptance_rate, total_accepted_draft_tokens, total_draft_tokens, num_output_tokens,
num_steps.

Every request goes to `SpecEngine.submit`, whose scheduler thread batches all running requests
and calls back once per step; responses are sent from that thread. A request whose client cancelled
it (`response_sender.is_cancelled()`, checked every step) is cancelled in the engine and counted in
spec_dec_requests_cancelled_total. Triton 2.51 passes that on only for requests made to this model
itself: an *ensemble* request cancelled by its client is never seen as cancelled here (is_cancelled()
stays false and every send succeeds), so it runs to its end and counts as completed.
A bad request fails with one line (INVALID_ARG); any other failure sends "internal error" and logs
the traceback (`serving.triton_error`). Prometheus metrics (labels model, method) are made with
`pb_utils.MetricFamily`; latencies are `_sum`/`_count` counter pairs (mean = rate(sum)/rate(count)).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.repository import serving, textio

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _input(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class Metrics:
    """The spec_dec_* Prometheus families of one model instance."""

    def __init__(self, model, method):
        labels = {"model": model, "method": method}
        self.families = []  # a Metric works only while its MetricFamily is alive

        def make(name, description, kind):
            family = pb_utils.MetricFamily(name=name, description=description, kind=kind)
            self.families.append(family)
            return family.Metric(labels=labels)

        counter, gauge = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE
        self.requests = make("spec_dec_requests_total", "Generation requests completed", counter)
        self.failures = make("spec_dec_request_failures_total", "Generation requests rejected or failed", counter)
        self.cancelled = make("spec_dec_requests_cancelled_total",
                              "Generation requests cancelled by their client (direct requests; Triton 2.51 does "
                              "not pass on the cancellation of an ensemble request)", counter)
        self.prompt_tokens = make("spec_dec_prompt_tokens_total", "Prompt tokens of accepted requests", counter)
        self.generated = make("spec_dec_generated_tokens_total", "Tokens generated (emitted to clients)", counter)
        self.steps = make("spec_dec_steps_total", "Verify steps (request-steps after the prefill)", counter)
        self.drafted = make("spec_dec_draft_tokens_total", "Draft tokens proposed", counter)
        self.accepted = make("spec_dec_accepted_tokens_total", "Draft tokens accepted by the target", counter)
        self.draft_sum = make("spec_dec_draft_latency_seconds_sum",
                              "Seconds spent drafting, summed per request-step (a batched step counts once "
                              "per request in it)", counter)
        self.draft_count = make("spec_dec_draft_latency_seconds_count", "Request-steps timed for drafting", counter)
        self.verify_sum = make("spec_dec_verify_latency_seconds_sum",
                               "Seconds spent verifying, summed per request-step (a batched step counts once "
                               "per request in it)", counter)
        self.verify_count = make("spec_dec_verify_latency_seconds_count", "Request-steps timed for verifying", counter)
        self.acceptance_rate = make("spec_dec_acceptance_rate",
                                    "Accepted / drafted tokens over the last 256 steps", gauge)
        self.tokens_per_step = make("spec_dec_tokens_per_step",
                                    "Tokens emitted per verify step over the last 256 steps", gauge)
        self.recent = serving.RecentSteps(256)

    def step(self, event):
        n = len(event.tokens)
        self.steps.increment(1)
        self.drafted.increment(event.drafted)
        self.accepted.increment(event.accepted)
        self.draft_sum.increment(float(event.draft_seconds))
        self.draft_count.increment(1)
        self.verify_sum.increment(float(event.verify_seconds))
        self.verify_count.increment(1)
        rate, per_step = self.recent.add(n, event.drafted, event.accepted)
        self.acceptance_rate.set(rate)
        self.tokens_per_step.set(per_step)


class Stream:
    """One request: accumulates its counters and sends its responses from the engine's thread."""

    def __init__(self, model, sender, streaming, stop):
        self.model = model
        self.sender = sender
        self.streaming = streaming
        self.stop = stop
        self.stop_words = np.asarray([[w.encode("utf-8") for w in stop] or [b""]], dtype=np.object_)
        self.stats = serving.StreamStats()
        # with stop strings the context is the whole output: a held partial stop string may reach
        # back past the last boundary token (see textio)
        self.text = textio.ContextTracker(None if stop else model.boundary)
        self.done = False

    def response(self, context, delta, final, stop_trim=0):
        s = self.stats
        tensors = [
            pb_utils.Tensor("output_ids", np.asarray(delta, dtype=np.int32).reshape(1, 1, -1)),
            pb_utils.Tensor("sequence_length", np.asarray([[len(delta)]], dtype=np.int32)),
            pb_utils.Tensor("context_ids", np.asarray(context, dtype=np.int32).reshape(1, -1)),
            pb_utils.Tensor("is_final", np.asarray([[final]], dtype=np.bool_)),
            pb_utils.Tensor("stop_trim", np.asarray([[stop_trim]], dtype=np.int32)),
            pb_utils.Tensor("stop_words_out", self.stop_words),
            pb_utils.Tensor("acceptance_rate", np.asarray([[s.acceptance_rate]], dtype=np.float32)),
            pb_utils.Tensor("total_accepted_draft_tokens", np.asarray([[s.accepted]], dtype=np.int32)),
            pb_utils.Tensor("total_draft_tokens", np.asarray([[s.drafted]], dtype=np.int32)),
            pb_utils.Tensor("num_output_tokens", np.asarray([[s.tokens]], dtype=np.int32)),
            pb_utils.Tensor("num_steps", np.asarray([[s.steps]], dtype=np.int32)),
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def on_event(self, event):
        """Called by the engine's scheduler thread once per step of this request."""
        if self.done:
            return
        try:
            self._on_event(event)
        except Exception as exc:  # never let a send failure kill the scheduler thread
            self.fail(serving.triton_error(pb_utils, exc, f"tensorrt_llm (request {event.request_id})"))

    def _on_event(self, event):
        s = self.stats
        if s.events and event.tokens:  # the first event is the prefill's token, not a verify step
            s.steps += 1
            self.model.metrics.step(event)
        s.events += 1
        s.tokens += len(event.tokens)
        s.drafted += event.drafted
        s.accepted += event.accepted
        self.model.metrics.generated.increment(len(event.tokens))
        if event.finish_reason == "shutdown":  # cut at the server's drain deadline: say so, do not hang
            self.fail(pb_utils.TritonError(f"generation cut after {s.tokens} tokens: the server is shutting down "
                                           "(drain deadline reached)", code=pb_utils.TritonError.UNAVAILABLE))
            return
        if event.finish_reason == "error":  # the engine's message may be long or name files: log it
            pb_utils.Logger.log_error(f"trtspec tensorrt_llm: request {event.request_id} failed: {event.error}")
            self.fail(pb_utils.TritonError("generation failed (internal error); the server log has the details",
                                           code=pb_utils.TritonError.INTERNAL))
            return
        if event.finish_reason == "cancelled" or self.sender.is_cancelled():
            if event.finish_reason != "cancelled":  # the client went away: free the engine's slot
                self.model.engine.cancel(event.request_id)
            self.fail(pb_utils.TritonError("request cancelled by the server (the model is shutting down)",
                                           code=pb_utils.TritonError.UNAVAILABLE))
            return
        context, delta = self.text.push(event.tokens)
        if event.finished:
            trim = self.stop_trim() if event.finish_reason == "stop" else 0
            if not self.streaming:
                context, delta = [], self.text.tokens
            self.sender.send(self.response(context, delta, True, trim), flags=FINAL)
            self.done = True
            self.model.metrics.requests.increment(1)
        elif self.streaming and delta:
            self.sender.send(self.response(context, delta, False))

    def stop_trim(self):
        """Characters after the start of the stop string the engine stopped on (it trims them too)."""
        full = textio.decode(self.model.tokenizer, self.text.tokens)
        hits = [i for i in (full.find(s) for s in self.stop) if i >= 0]
        return len(full) - min(hits) if hits else 0

    def fail(self, error):
        """End the request with `error` (a TritonError), or, if the client cancelled it, with the bare
        final flag that releases it in Triton (counted as cancelled, not as a failure)."""
        self.done = True
        try:
            if self.sender.is_cancelled():
                self.model.metrics.cancelled.increment(1)
                self.sender.send(flags=FINAL)
            else:
                self.model.metrics.failures.increment(1)
                self.sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=FINAL)
        except Exception:  # the client may be gone already
            pass


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("tensorrt_llm (torch runtime) must be decoupled "
                                                "(model_transaction_policy { decoupled: true })")
        params = serving.model_parameters(config)
        engine_dir = serving.resolve_engine_dir(args["model_repository"], params)
        spec = serving.load_engine_spec(engine_dir)
        if args.get("model_instance_kind") == "GPU":
            import torch

            torch.cuda.set_device(int(args.get("model_instance_device_id", 0)))
        from trtspec.runtime import SpecEngine

        self.engine = SpecEngine.from_spec(spec)
        self.tokenizer = self.engine.tokenizer
        self.boundary = textio.boundary_tokens(self.tokenizer)
        self.limits = spec.limits
        self.metrics = Metrics(spec.name, spec.method)
        serving.watch_server(on_drain=self.drain)  # exit with the server; drain when it stops

    def drain(self, deadline, refuse_new, on_idle):
        """The server is stopping (trtspec wrote its drain request): finish what is in flight, cut the rest
        at `deadline` (their streams end with an UNAVAILABLE error saying so)."""
        self.engine.drain(deadline, refuse_new=refuse_new, on_idle=on_idle)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                ids, params, streaming = self.parse(request)
                stream = Stream(self, sender, streaming, params.stop)
                self.engine.submit(ids, params, stream.on_event)
                self.metrics.prompt_tokens.increment(len(ids))
            except Exception as exc:  # bad request (GenerationError, RequestError) or engine failure
                self.metrics.failures.increment(1)
                error = serving.triton_error(pb_utils, exc, "tensorrt_llm")
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=FINAL)
        return None

    def parse(self, request):
        from trtspec.runtime import SamplingParams

        ids = serving.require(_input(request, "input_ids"), "input_ids")
        serving.check_batch(ids, "input_ids")
        ids = ids.reshape(-1)
        n = serving.scalar(_input(request, "input_lengths"), "input_lengths", int)
        if n is not None and not 0 <= n <= ids.size:
            raise serving.RequestError(f"input_lengths {n} is outside 0..{ids.size} (the ids in input_ids)")
        ids = ids[:n]
        max_tokens = serving.scalar(serving.require(_input(request, "request_output_len"), "request_output_len"),
                                    "request_output_len", int)
        serving.check_lengths(ids.size, max_tokens, self.limits.max_input_len, self.limits.max_output_len)
        ids = ids.astype(np.int64).tolist()  # (after the length check: no list of a huge tensor)
        k = serving.scalar(_input(request, "num_draft_tokens"), "num_draft_tokens", int)
        if k is not None and not 0 <= k <= self.engine.k_max:  # no value: over HTTP it may have wrapped
            raise serving.RequestError(f"num_draft_tokens must be in 0..{self.engine.k_max} (0: no speculation)")
        stop = _input(request, "stop_words")
        stop = tuple(s.decode("utf-8", errors="replace") if isinstance(s, bytes) else str(s)
                     for s in (stop.reshape(-1) if stop is not None else ()) if s)
        kwargs = {
            "max_new_tokens": max_tokens,
            "temperature": serving.scalar(_input(request, "temperature"), "temperature", float),
            "top_k": serving.scalar(_input(request, "runtime_top_k"), "top_k", int),
            "top_p": serving.scalar(_input(request, "runtime_top_p"), "top_p", float),
            "seed": serving.scalar(_input(request, "seed"), "seed", int),
            "end_id": serving.scalar(_input(request, "end_id"), "end_id", int),
            "stop": stop,
            "num_draft_tokens": k,
        }
        params = SamplingParams(**{key: v for key, v in kwargs.items() if v is not None or key == "num_draft_tokens"})
        streaming = bool(serving.scalar(_input(request, "streaming"), "stream", bool) or False)
        return ids, params, streaming

    def finalize(self):
        serving.forget_instance()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
