"""`tensorrt_llm` for the torch runtime: speculative decoding with continuous batching
(Triton Python backend, decoupled; copied into tensorrt_llm/1/model.py).

It mirrors the tensorrtllm_backend model's name and I/O so that ensembles and clients port
unchanged: inputs input_ids, input_lengths, request_output_len, end_id, temperature,
runtime_top_k, runtime_top_p, seed, streaming, plus stop_words (strings), num_draft_tokens
(0 = no speculation) and task (a routed spec: the request's drafter, see runtime/router.py; an unknown task
is INVALID_ARG; a spec with one drafter ignores it) and in_band_errors (set by the ensemble's preprocessing;
see Stream.fail); outputs output_ids / sequence_length (the ids accepted since the previous
response; all of them when not streaming), context_ids, is_final, stop_trim and stop_words_out (for
exact streaming detokenization in `postprocessing`, see trtspec/runtime/detok.py) and the per-request
counters acceptance_rate, total_accepted_draft_tokens, total_draft_tokens, num_output_tokens,
num_steps, and error (empty, or the in-band error of a stream cut inside the ensemble).

Every request goes to `SpecEngine.submit`, whose scheduler thread batches all running requests
and calls back once per step; responses are sent from that thread. A request whose client cancelled
it (`response_sender.is_cancelled()`, checked every step) is cancelled in the engine and counted in
spec_dec_requests_cancelled_total. Triton 2.51 passes that on only for requests made to this model
itself: an *ensemble* request cancelled by its client is never seen as cancelled here (is_cancelled()
stays false and every send succeeds), so it runs to its end and counts as completed.
A bad request fails with one line (INVALID_ARG); any other failure sends "internal error" and logs
the traceback (`serving.triton_error`). Prometheus metrics (labels model, method) are made with
`pb_utils.MetricFamily` and fed by the engine's per-step SpecDecodingStats (engine.on_step); latencies are
`_sum`/`_count` counter pairs (mean = rate(sum)/rate(count)); spec_dec_accepted_tokens_per_position_total
{position="i"} counts accepted tokens per draft position, as vLLM's spec_decode_num_accepted_tokens_per_pos.
A routed spec adds spec_dec_drafter_* families (labels model, method, drafter): each drafter's share of the
steps, draft tokens, accepted tokens and emitted tokens.
"""

import functools
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.repository import serving
from trtspec.runtime import detok
from trtspec.runtime.stats import RequestStats

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


_input = functools.partial(serving.input_array, pb_utils)  # (request, name) -> numpy array or None


COUNTER, GAUGE = "COUNTER", "GAUGE"  # pb_utils.MetricFamily.<kind> (it exists once the stub runs, not at import)
FAMILIES = (  # attribute, Prometheus name, kind, description (labels: model, method)
    ("requests", "spec_dec_requests_total", COUNTER, "Generation requests completed"),
    ("failures", "spec_dec_request_failures_total", COUNTER, "Generation requests rejected or failed"),
    ("cancelled", "spec_dec_requests_cancelled_total", COUNTER,
     "Generation requests cancelled by their client (direct requests; Triton 2.51 does not pass on the "
     "cancellation of an ensemble request)"),
    ("prompt_tokens", "spec_dec_prompt_tokens_total", COUNTER, "Prompt tokens of accepted requests"),
    ("generated", "spec_dec_generated_tokens_total", COUNTER, "Tokens generated (emitted to clients)"),
    ("steps", "spec_dec_steps_total", COUNTER, "Verify steps (request-steps after the prefill)"),
    ("drafts", "spec_dec_drafts_total", COUNTER,
     "Verify steps that drafted at least one token (per-position acceptance: "
     "spec_dec_accepted_tokens_per_position_total / this)"),
    ("drafted", "spec_dec_draft_tokens_total", COUNTER, "Draft tokens proposed"),
    ("accepted", "spec_dec_accepted_tokens_total", COUNTER, "Draft tokens accepted by the target"),
    ("draft_sum", "spec_dec_draft_latency_seconds_sum", COUNTER,
     "Seconds spent drafting, summed per request-step (a batched step counts once per request in it)"),
    ("draft_count", "spec_dec_draft_latency_seconds_count", COUNTER, "Request-steps timed for drafting"),
    ("verify_sum", "spec_dec_verify_latency_seconds_sum", COUNTER,
     "Seconds spent verifying, summed per request-step (a batched step counts once per request in it)"),
    ("verify_count", "spec_dec_verify_latency_seconds_count", COUNTER, "Request-steps timed for verifying"),
    ("acceptance_rate", "spec_dec_acceptance_rate", GAUGE,
     "Accepted / drafted tokens over the engine's last 256 (batched) steps"),
    ("tokens_per_step", "spec_dec_tokens_per_step", GAUGE,
     "Tokens emitted per verify step (prefill tokens excluded) over the engine's last 256 steps"),
)
PER_POSITION = "spec_dec_accepted_tokens_per_position_total"  # vLLM: vllm:spec_decode_num_accepted_tokens_per_pos
DRAFTER_FAMILIES = (  # a routed spec: per drafter (label drafter), from SpecDecodingStats' per-request lists
    ("steps", "spec_dec_drafter_steps_total", "Verify steps (request-steps) of the requests routed to the drafter"),
    ("drafted", "spec_dec_drafter_draft_tokens_total", "Draft tokens the drafter proposed"),
    ("accepted", "spec_dec_drafter_accepted_tokens_total", "Draft tokens of the drafter the target accepted"),
    ("emitted", "spec_dec_drafter_emitted_tokens_total", "Tokens emitted by the steps of the drafter's requests"),
)


COST_FAMILIES = (  # the engine's cost table (runtime/costs.py), set once at load: labels model, method + rows/drafter
    ("spec_dec_verify_cost_seconds", "rows", "Seconds of one target pass over this many rows in all (measured at "
     "load, or injected), which adaptive K prices its options with"),
    ("spec_dec_draft_cost_seconds", "drafter", "Seconds of one draft step of the drafter (measured at load, or "
     "injected)"),
)
DRAFT_BATCH_COST = ("spec_dec_draft_batch_cost_seconds", "Seconds of one draft step of this many requests together "
                    "(label batch; measured at load, or injected)")
SHARED_FAMILIES = (  # per drafter (runtime/adaptive.py's SharedAcceptance), after each step
    ("spec_dec_shared_acceptance", GAUGE, "The drafter's per-token acceptance pooled over its recent greedy and "
     "unseeded requests: what adaptive K prices a new request at in a step of several (NaN until known)"),
    ("spec_dec_priced_off_requests_total", COUNTER, "New requests that drafted nothing in a step of several "
     "because the drafter's shared acceptance does not pay at that batch"),
)


class Metrics:
    """The spec_dec_* Prometheus families of one model instance, fed by the engine's per-step
    SpecDecodingStats (`observe`, an engine.on_step observer) and by the request lifecycle; the cost table
    (`costs`, a runtime.costs.CostTable) as gauges set once; each drafter's shared acceptance (`shared`: drafter
    name -> runtime.adaptive.SharedAcceptance, the engine's own) read after each step."""

    def __init__(self, model, method, positions, drafters=(), costs=None, shared=None):
        labels = {"model": model, "method": method}
        self.families = []  # a Metric works only while its MetricFamily is alive
        for attribute, name, kind, description in FAMILIES:
            family = pb_utils.MetricFamily(name=name, description=description,
                                           kind=getattr(pb_utils.MetricFamily, kind))
            self.families.append(family)
            setattr(self, attribute, family.Metric(labels=labels))
        family = pb_utils.MetricFamily(name=PER_POSITION, kind=pb_utils.MetricFamily.COUNTER,
                                       description="Draft tokens accepted at each draft position (0: the first "
                                                   "draft token; a tree counts the depth of the accepted path)")
        self.families.append(family)
        self.per_position = [family.Metric(labels={**labels, "position": str(i)}) for i in range(positions)]
        self.recent = serving.RecentSteps(256)
        routed = []
        for attribute, name, description in DRAFTER_FAMILIES if drafters else ():
            family = pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.COUNTER)
            self.families.append(family)
            routed.append((attribute, family))
        # per drafter (engine.drafter_names' order): {attribute: Metric}
        self.drafters = [{a: f.Metric(labels={**labels, "drafter": d}) for a, f in routed} for d in drafters]
        if costs is not None:
            (verify, rows_label, verify_doc), (draft, drafter_label, draft_doc) = COST_FAMILIES
            for name, label, doc, values in ((verify, rows_label, verify_doc, costs.verify),
                                             (draft, drafter_label, draft_doc, costs.draft)):
                family = pb_utils.MetricFamily(name=name, description=doc, kind=pb_utils.MetricFamily.GAUGE)
                self.families.append(family)
                for key, seconds in values.items():
                    family.Metric(labels={**labels, label: str(key)}).set(float(seconds))
            by_batch = costs.draft_by_batch
            if by_batch:
                family = pb_utils.MetricFamily(name=DRAFT_BATCH_COST[0], description=DRAFT_BATCH_COST[1],
                                               kind=pb_utils.MetricFamily.GAUGE)
                self.families.append(family)
                for drafter, points in by_batch.items():
                    for batch, seconds in points.items():
                        family.Metric(labels={**labels, drafter_label: drafter, "batch": str(batch)}).set(
                            float(seconds))
        self.shared = []  # (SharedAcceptance, its gauge, its counter, the count already exported)
        made = [pb_utils.MetricFamily(name=name, description=doc, kind=getattr(pb_utils.MetricFamily, kind))
                for name, kind, doc in SHARED_FAMILIES] if shared else []
        self.families += made
        for drafter, acceptance in (shared or {}).items():
            gauge, counter = (f.Metric(labels={**labels, "drafter": drafter}) for f in made)
            gauge.set(float("nan"))
            self.shared.append([acceptance, gauge, counter, 0])

    def observe(self, step):
        """One engine step (called on the engine's thread before the step's responses are sent)."""
        n = step.batch_size
        self.steps.increment(n)
        self.drafts.increment(step.num_drafts)
        self.drafted.increment(step.num_draft_tokens)
        self.accepted.increment(step.num_accepted_tokens)
        self.draft_sum.increment(float(step.draft_seconds) * n)
        self.draft_count.increment(n)
        self.verify_sum.increment(float(step.verify_seconds) * n)
        self.verify_count.increment(n)
        for metric, count in zip(self.per_position, step.accepted_per_position):
            if count:
                metric.increment(count)
        rate, per_step = self.recent.add(step)
        self.acceptance_rate.set(rate)
        self.tokens_per_step.set(per_step)
        if self.drafters and step.drafters:
            sums = [{"steps": 0, "drafted": 0, "accepted": 0, "emitted": 0} for _ in self.drafters]
            for d, drafted, accepted, emitted in zip(step.drafters, step.drafted, step.accepted, step.emitted):
                row = sums[d]
                row["steps"] += 1
                row["drafted"] += drafted
                row["accepted"] += accepted
                row["emitted"] += emitted
            for metrics, row in zip(self.drafters, sums):
                for attribute, value in row.items():
                    if value:
                        metrics[attribute].increment(value)
        for entry in self.shared:
            acceptance, gauge, counter, exported = entry
            alpha = acceptance.alpha
            gauge.set(float("nan") if alpha is None else alpha)
            if acceptance.priced_off > exported:
                counter.increment(acceptance.priced_off - exported)
                entry[3] = acceptance.priced_off


class Stream:
    """One request: accumulates its counters and sends its responses from the engine's thread."""

    def __init__(self, model, sender, streaming, stop, in_band=False):
        self.model = model
        self.sender = sender
        self.streaming = streaming
        self.in_band = in_band  # inside the ensemble: errors travel in band to postprocessing (see fail)
        self.stop = stop
        self.stop_words = np.asarray([[w.encode("utf-8") for w in stop] or [b""]], dtype=np.object_)
        self.stats = RequestStats()
        # with stop strings the context is the whole output: a held partial stop string may reach
        # back past the last boundary token (see trtspec/runtime/detok.py)
        self.text = detok.ContextTracker(None if stop else model.boundary)
        self.done = False

    def response(self, context, delta, final, stop_trim=0, error=b""):
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
            pb_utils.Tensor("error", np.asarray([[error]], dtype=np.object_)),
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
        s.observe(event)  # (the step's spec_dec_* counters came from engine.on_step, before this event)
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
        return detok.stop_trim(self.model.tokenizer, self.text.tokens, self.stop)

    def fail(self, error):
        """End the request with `error` (a TritonError), or, if the client cancelled it, with the bare
        final flag that releases it in Triton (counted as cancelled, not as a failure).

        Inside the ensemble (`in_band`) the error goes out as the ERROR output of a normal final response,
        and `postprocessing` raises it: Triton 2.51's ensemble never releases a request whose decoupled step
        fails while a later step of it (postprocessing of an earlier response) still runs; the ensemble and
        postprocessing then never unload and the server hangs at exit (seen after drain-deadline cuts)."""
        self.done = True
        try:
            if self.sender.is_cancelled():
                self.model.metrics.cancelled.increment(1)
                self.sender.send(flags=FINAL)
                return
            self.model.metrics.failures.increment(1)
            if self.in_band:
                self.sender.send(self.response([], [], True, error=in_band(error)), flags=FINAL)
            else:
                self.sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=FINAL)
        except Exception as exc:  # the client may be gone already
            pb_utils.Logger.log_error(f"trtspec tensorrt_llm: the final response could not be sent: {exc!r}")


def in_band(error):
    """A TritonError as the ERROR output postprocessing reads: JSON {"code": its name, "message"} (the
    stub's TritonError has code() and message() methods; code() is an enum member, named by .name)."""
    code, message = getattr(error, "code", "INTERNAL"), getattr(error, "message", str(error))
    code, message = (code() if callable(code) else code), (message() if callable(message) else message)
    return json.dumps({"code": code if isinstance(code, str) else code.name, "message": str(message)}).encode("utf-8")


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
        from trtspec import methods  # (this model is its process's composition point: the spec's proposer)

        self.engine = methods.engine(spec)
        self.tokenizer = self.engine.tokenizer
        self.boundary = detok.boundary_tokens(self.tokenizer)
        self.limits = spec.limits
        self.metrics = Metrics(spec.name, spec.method, self.engine.plan.max_depth, self.engine.drafter_names,
                               self.engine.costs, dict(zip(self.engine.drafters, self.engine.shared)))
        self.engine.on_step.append(self.metrics.observe)
        serving.watch_server(on_drain=self.drain)  # exit with the server; drain when it stops

    def drain(self, deadline, refuse_new, on_idle):
        """The server is stopping (trtspec wrote its drain request): finish what is in flight, cut the rest
        at `deadline` (their streams end with an UNAVAILABLE error saying so)."""
        self.engine.drain(deadline, refuse_new=refuse_new, on_idle=on_idle)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                ids, params, streaming, task = self.parse(request)
                in_band = bool(serving.scalar(_input(request, "in_band_errors"), "in_band_errors", bool))
                stream = Stream(self, sender, streaming, params.stop, in_band)
                self.engine.submit(ids, params, stream.on_event, task)
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
        task = serving.scalar(_input(request, "task"), "task", str)
        return ids, params, streaming, task or None

    def finalize(self):
        serving.forget_instance()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
