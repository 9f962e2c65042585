"""Per-drafter metrics of a routed deployment, without a server: the served model's exporter (spec_dec_drafter_*
families fed by the engine's per-step stats) and `trtspec status`'s reading of them."""

from __future__ import annotations

import types

from trtspec.runtime.stats import SpecDecodingStats


class _Family:
    """pb_utils.MetricFamily as the exporter uses it: Metric(labels) with increment/set."""

    COUNTER, GAUGE = "counter", "gauge"
    made: list["_Family"] = []

    def __init__(self, name, description, kind):
        self.name, self.kind, self.metrics = name, kind, []
        _Family.made.append(self)

    def Metric(self, labels):  # noqa: N802 - pb_utils' spelling
        m = types.SimpleNamespace(labels=labels, value=0.0)
        m.increment = lambda v, m=m: setattr(m, "value", m.value + v)
        m.set = lambda v, m=m: setattr(m, "value", v)
        self.metrics.append(m)
        return m

    def text(self) -> str:
        rows = [f"# TYPE {self.name} {self.kind}"]
        for m in self.metrics:
            labels = ",".join(f'{k}="{v}"' for k, v in m.labels.items())
            rows.append(f"{self.name}{{{labels}}} {m.value}")
        return "\n".join(rows)


def test_routed_metrics_count_each_request_step_on_its_drafter():
    from prometheus_client.parser import text_string_to_metric_families

    from tests.test_request_properties import _load_model
    from trtspec.serve.control import spec_metrics

    module = _load_model("tensorrt_llm.py")
    module.pb_utils.MetricFamily = _Family
    _Family.made = []
    metrics = module.Metrics("demo-routed", "routed", 4, ["prose", "code"])
    # rows: code (drafted 4, accepted 3, emitted 4), prose (2, 0, 1), code (4, 4, 5)
    metrics.observe(SpecDecodingStats([4, 2, 4], [4, 2, 4], [3, 0, 4], [4, 1, 5], 0.01, 0.02, [1, 0, 1]))
    metrics.observe(SpecDecodingStats([2], [2], [2], [3], 0.01, 0.02, [0]))
    text = "\n".join(f.text() for f in _Family.made) + "\n"
    samples = [(s.name, dict(s.labels), float(s.value))
               for f in text_string_to_metric_families(text) for s in f.samples]
    row = spec_metrics(samples)["demo-routed"]
    assert row["method"] == "routed" and row["acceptance_rate"] == 9 / 12  # the totals stay the deployment's
    assert row["drafters"] == {
        "code": {"steps": 2, "draft_tokens": 8, "accepted_tokens": 7, "acceptance_rate": 7 / 8, "tokens_per_step": 4.5},
        "prose": {"steps": 2, "draft_tokens": 4, "accepted_tokens": 2, "acceptance_rate": 0.5, "tokens_per_step": 2.0}}


def test_a_single_drafter_deployment_exports_no_drafter_families():
    from tests.test_request_properties import _load_model

    module = _load_model("tensorrt_llm.py")
    module.pb_utils.MetricFamily = _Family
    _Family.made = []
    metrics = module.Metrics("demo", "eagle", 4)
    metrics.observe(SpecDecodingStats([4], [4], [3], [4], 0.01, 0.02))
    assert not [f for f in _Family.made if f.name.startswith("spec_dec_drafter_")]


def test_the_cost_table_is_exported_as_gauges_and_read_back_by_status():
    """spec_dec_verify_cost_seconds{rows} and spec_dec_draft_cost_seconds{drafter}, set once from the engine's
    table, come back through `trtspec status`'s parser as the table itself."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.test_request_properties import _load_model
    from trtspec.runtime.costs import CostTable
    from trtspec.serve.control import spec_metrics

    module = _load_model("tensorrt_llm.py")
    module.pb_utils.MetricFamily = _Family
    _Family.made = []
    table = CostTable({1: 0.01, 2: 0.0125, 5: 0.02}, {"prose": 0.004, "code": 0.0001}, "measured",
                      {"prose": {2: 0.005, 4: 0.006}})
    metrics = module.Metrics("demo-routed", "routed", 4, ["prose", "code"], table)
    metrics.observe(SpecDecodingStats([4], [4], [3], [4], 0.01, 0.02, [1]))
    text = "\n".join(f.text() for f in _Family.made) + "\n"
    samples = [(s.name, dict(s.labels), float(s.value))
               for f in text_string_to_metric_families(text) for s in f.samples]
    assert spec_metrics(samples)["demo-routed"]["costs"] == {"verify": {1: 0.01, 2: 0.0125, 5: 0.02},
                                                             "draft": {"prose": 0.004, "code": 0.0001},
                                                             "draft_by_batch": {"prose": {2: 0.005, 4: 0.006}}}


def test_each_drafters_shared_acceptance_is_exported_and_shown_by_status(capsys):
    """spec_dec_shared_acceptance{drafter} (NaN until known) and spec_dec_priced_off_requests_total{drafter},
    read from the engine's SharedAcceptance after each step, come back through `trtspec status`'s parser (None
    until known) and its table: why a drafter drafts nothing under load."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.test_request_properties import _load_model
    from trtspec.cli.status import _print
    from trtspec.runtime.adaptive import SharedAcceptance
    from trtspec.serve.control import spec_metrics

    module = _load_model("tensorrt_llm.py")
    module.pb_utils.MetricFamily = _Family
    _Family.made = []
    shared = {"prose": SharedAcceptance(least=2), "code": SharedAcceptance(least=2)}
    metrics = module.Metrics("demo-routed", "routed", 4, ["prose", "code"], None, shared)

    def read() -> dict:
        metrics.observe(SpecDecodingStats([4], [4], [3], [4], 0.01, 0.02, [1]))
        text = "\n".join(f.text() for f in _Family.made) + "\n"
        return spec_metrics([(s.name, dict(s.labels), float(s.value))
                             for f in text_string_to_metric_families(text) for s in f.samples])["demo-routed"]

    assert read()["under_load"] == {"code": {"shared_acceptance": None, "priced_off_requests": 0},
                                    "prose": {"shared_acceptance": None, "priced_off_requests": 0}}
    shared["prose"].add(3, 4)
    shared["prose"].add(1, 4)  # known after `least` request-steps: 4 accepted of 8 tested
    shared["code"].wait()
    shared["code"].wait()
    assert read()["under_load"] == {"code": {"shared_acceptance": None, "priced_off_requests": 2},
                                    "prose": {"shared_acceptance": 0.5, "priced_off_requests": 0}}
    shared["code"].wait()
    row = read()
    assert row["under_load"]["code"]["priced_off_requests"] == 3  # a counter: each wait once
    _print({"url": "localhost:8000", "live": True, "ready": True, "index": "index", "models": {},
            "metrics": {"demo-routed": row}})
    shown = capsys.readouterr().out
    assert "shared acceptance" in shown and "0.50" in shown
    assert any("code" in line and line.rstrip(" │").endswith("3") for line in shown.splitlines())
