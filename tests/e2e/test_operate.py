"""Operate a served deployment (the session's shared server, tests/e2e/conftest.py): the bench grid at two
concurrencies and two K with JSON and a PNG, `trtspec status`, and `trtspec tune` writing a schedule that the
runtime then follows. Deploy records and rollback: test_operate_deploy.py."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trtspec.cli import main

pytestmark = pytest.mark.e2e


def _spec_copy(spec, path):
    """The spec as a file of its own (absolute paths), for commands that rewrite it."""
    import tomlkit

    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if v is not None}
        return x

    path.write_text("# a user's comment\n" + tomlkit.dumps(clean(spec.to_dict())))
    return path


def _invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def test_bench_grid_served_two_concurrencies_two_k(e2e, tmp_path):
    d = e2e.deployments["draft-model"]
    out, plot = tmp_path / "grid.json", tmp_path / "grid.png"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in e2e.prompts))
    text = _invoke("bench", "-c", d.spec.source, "--url", e2e.server.grpc_url, "--model", d.ensemble,
                   "--metrics-url", e2e.server.metrics_url, "--prompts", prompts, "--max-tokens", 12,
                   "--concurrency", "1,3", "--num-draft-tokens", "0,3", "-o", out, "--plot", plot, "--json")
    (grid,) = json.loads(text)
    assert json.loads(out.read_text()) == [grid] and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    points = {(p["concurrency"], p["num_draft_tokens"]): p for p in grid["points"]}
    assert set(points) == {(1, "0"), (1, "3"), (3, "0"), (3, "3")}
    for (c, k), p in points.items():
        assert p["requests"] == 3 and p["output_tokens"] == 36 and p["greedy_mismatches"] == 0  # lossless
        assert p["ttft_s"]["p50"] > 0 and p["itl_s"]["p99"] >= p["itl_s"]["p50"] > 0
        if k == "3":
            assert p["drafted"] > 0 and p["tokens_per_step"] > 1.0
            pos = p["per_position_acceptance"]  # from the server's per-position counters over the point
            assert pos and len(pos) <= 3 and pos == sorted(pos, reverse=True) and 0 < pos[0] <= 1
        else:
            assert p["drafted"] == 0 and p["speedup"] == 1.0 and p["per_position_acceptance"] is None


def test_status_lists_models_revisions_and_spec_decode_metrics(e2e):
    from trtspec.client import generate_remote

    d = e2e.deployments["eagle"]
    generate_remote(e2e.server.grpc_url, e2e.prompts[0], max_tokens=8, model=d.ensemble)
    out = json.loads(_invoke("status", "--url", e2e.server.http_url, "--metrics-url", e2e.server.metrics_url,
                             "--admin-key", e2e.server.admin_key, "--json"))
    assert out["live"] and out["ready"] and out["index"] == "repository index"
    for model in (d.ensemble, "tensorrt_llm_eagle", "preprocessing", "postprocessing"):
        assert out["models"][model]["ready"] and out["models"][model]["state"] == "READY"
    gen = out["metrics"][d.spec.name]  # spec_dec_* carry the deployment's name; nv_inference_* Triton's model names
    assert gen["method"] == "eagle" and gen["requests"] >= 1 and gen["generated_tokens"] >= 8
    assert 0 < gen["acceptance_rate"] <= 1 and gen["per_position_acceptance"]
    under = gen["under_load"]  # per drafter: a single-drafter spec's is its method
    assert set(under) == {"eagle"} and under["eagle"]["priced_off_requests"] >= 0
    assert under["eagle"]["shared_acceptance"] is None or 0 <= under["eagle"]["shared_acceptance"] <= 1
    assert out["metrics"][d.ensemble]["inferences"] >= 1
    # without the admin key the index is closed: only the spec's own ensemble is asked, through the open API
    closed = json.loads(_invoke("status", "-c", d.spec.source, "--url", e2e.server.http_url, "--json"))
    assert closed["index"].startswith("not readable") and set(closed["models"]) == {d.spec.serving.ensemble_name}


def test_tune_writes_a_schedule_the_runtime_then_follows(e2e, tmp_path):
    from trtspec import methods
    from trtspec.check import load_spec
    from trtspec.runtime import SamplingParams

    d = e2e.deployments["draft-model"]
    path = _spec_copy(d.served_spec, tmp_path / "tuned.toml")
    report = json.loads(_invoke("tune", "-c", path, "--url", e2e.server.grpc_url, "--model", d.ensemble,
                                "--concurrency", "1,2", "--num-draft-tokens", "0,2", "-n", 2, "--max-tokens", 8,
                                "--json"))
    spec = load_spec(path)
    schedule = spec.speculative.schedule
    assert report["written"] and {int(b): k for b, k in report["schedule"].items()} == schedule
    assert schedule[1] == spec.speculative.num_draft_tokens and schedule[2] in (0, 2)
    assert path.read_text().startswith("# a user's comment\n")
    assert [r["concurrency"] for r in report["bands"]] == [1, 2] and report["bands"][0]["before_tokens_per_s"] > 0
    engine = methods.engine(spec)
    steps = []
    engine.on_step.append(lambda s: steps.append((s.batch_size, max(s.drafted))))
    try:
        engine.generate_batch(e2e.prompts[:2], SamplingParams(max_new_tokens=12))
    finally:
        engine.close()
    assert [k for b, k in steps if b == 2] and all(k <= schedule[2] for b, k in steps if b == 2)


def test_routing_sends_code_and_prose_to_their_drafters(e2e):
    """A routed deployment (two drafters, one server): each request is counted on its drafter's metrics — by
    the classifier (demo family: a code prompt, a prose prompt) or by its task (tritonclient, and the generate
    endpoint's JSON key) — outputs stay those of plain decoding, and an unknown task is refused."""
    import urllib.request

    from trtspec.client import generate_remote
    from trtspec.errors import ClientError
    from trtspec.serve.control import scrape, spec_metrics

    d = e2e.routed
    name = d.spec.name

    def steps():
        drafters = spec_metrics(scrape(e2e.server.metrics_url))[name].get("drafters", {})
        return {k: drafters.get(k, {}).get("steps", 0) for k in ("code", "prose")}

    code = e2e.prompts[0]
    prose = "What is the difference between a list and a tuple?" if e2e.demo else "w1 w2 w3 w4"
    before = steps()
    # demo: the classifier routes the code prompt; the tiny family's tokens read as prose, so its task says it
    got = generate_remote(e2e.server.grpc_url, code, max_tokens=12, model=d.ensemble,
                          task=None if e2e.demo else "code")
    after_code = steps()
    assert after_code["code"] > before["code"] and after_code["prose"] == before["prose"]
    plain = generate_remote(e2e.server.grpc_url, code, max_tokens=12, model=d.ensemble, num_draft_tokens=0)
    assert got.text == plain.text and got.total_draft_tokens > 0
    after_plain = steps()
    generate_remote(e2e.server.grpc_url, prose, max_tokens=12, model=d.ensemble, task=None if e2e.demo else "prose")
    after_prose = steps()
    assert after_prose["prose"] > after_plain["prose"] and after_prose["code"] == after_plain["code"]
    body = json.dumps({"text_input": prose, "max_tokens": 6, "task": "code"}).encode()
    request = urllib.request.Request(f"http://{e2e.server.http_url}/v2/models/{d.ensemble}/generate", data=body,
                                     headers={"Content-Type": "application/json"})
    assert json.loads(urllib.request.urlopen(request, timeout=60).read())["text_output"]
    assert steps()["code"] > after_prose["code"]
    with pytest.raises(ClientError, match="unknown task 'kode'"):
        generate_remote(e2e.server.grpc_url, code, max_tokens=4, model=d.ensemble, task="kode")
    out = json.loads(_invoke("status", "--url", e2e.server.http_url, "--metrics-url", e2e.server.metrics_url, "--json"))
    row = out["metrics"][name]
    assert row["method"] == "routed" and set(row["drafters"]) == {"code", "prose"}
    assert all(0 <= x["acceptance_rate"] <= 1 and x["tokens_per_step"] >= 1 for x in row["drafters"].values())
