"""Runs the bad-input catalogue (tests/catalogue/cases.py): each case's input must give its one-line error and
exit code / gRPC status; docs/errors.md must be what the cases render to.

Spec, checkpoint and CLI cases run `trtspec.cli.main` (click's CliRunner) in a private temp dir holding a copy
of the tiny test family and the case's spec; request cases go to ONE real Triton server serving one small
deployment (lookahead: no drafter weights) for the whole module, which must still serve a good request after
all of them. With TRTSPEC_CATALOGUE_CAPTURE=1 (`make catalogue`) every case also records its real message in
samples.json, from which docs/errors.md is rendered."""

from __future__ import annotations

import queue
import re
import shutil
import types
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.catalogue import render, samples
from tests.catalogue.cases import CASES, CHECK, GROUPS, Case, spec_text
from tests.runtime import family
from trtspec.cli import main

OFFLINE = [c for c in CASES if c.group != "request"]
REQUESTS = [c for c in CASES if c.group == "request"]


def _params(cases: list[Case], *marks) -> list:
    return [pytest.param(c, id=c.id, marks=[*marks] + ([pytest.mark.xfail(strict=True, reason=c.xfail)]
                                                        if c.xfail else [])) for c in cases]


# --------------------------------------------------------------------------------- the list itself


def test_the_catalogue_has_at_least_40_cases_across_every_group():
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)
    for group in GROUPS:
        assert sum(c.group == group for c in CASES) >= 5, group
    for case in CASES:
        assert case.group in GROUPS and (case.exit is None) != (case.status is None), case.id
        re.compile(case.expect)


def test_every_case_has_a_real_sample_that_matches_it():
    if samples.capturing():
        pytest.skip("capturing: samples.json is being rewritten")
    captured = samples.load()
    for case in CASES:
        assert case.id in captured, f"{case.id}: no sample; run `make catalogue`"
        if not case.xfail:
            assert re.search(case.expect, captured[case.id]["message"]), (case.id, captured[case.id])
            assert captured[case.id]["outcome"] == case.outcome, (case.id, captured[case.id])
    assert not set(captured) - {c.id for c in CASES}, "samples of cases that are gone: run `make catalogue`"


def test_docs_errors_md_is_up_to_date():
    if samples.capturing():
        pytest.skip("capturing: docs/errors.md is rendered afterwards")
    assert render.DOC.read_text(encoding="utf-8") == render.render(), \
        "docs/errors.md is out of date: run `python -m tests.catalogue.render` (or `make catalogue`)"


# ----------------------------------------------------------------------- spec, checkpoint and CLI


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return family.build_family(tmp_path_factory.mktemp("catalogue-family"))


def _invoke(argv: list[str], cwd: Path, monkeypatch) -> tuple[int, str, BaseException | None]:
    monkeypatch.chdir(cwd)
    result = CliRunner().invoke(main, argv)
    unexpected = result.exception if not isinstance(result.exception, SystemExit) else None
    return result.exit_code, result.output, unexpected


def _check_cli(case: Case, code: int, output: str, unexpected: BaseException | None, *roots: Path) -> None:
    lines = output.splitlines()
    error = next((line for line in lines if line.startswith("error: ")), None)
    if error is not None:
        shown = error
    elif unexpected is not None:  # a traceback: what its last line says
        shown = f"{type(unexpected).__name__}: {unexpected} (a traceback)"
    else:
        shown = next((line for line in reversed(lines) if line.strip()), "(no output)")
    samples.record(case.id, shown, f"exit {code}", *roots)
    assert unexpected is None and "Traceback" not in output, output
    assert error is not None and re.search(case.expect, error), output
    assert any(line.startswith("hint: ") for line in lines), output
    assert code == case.exit, output


@pytest.mark.parametrize("case", _params(OFFLINE))
def test_offline_case(case: Case, pristine, tmp_path, monkeypatch):
    from trtspec.serve.endpoints import free_port

    fam = Path(shutil.copytree(pristine, tmp_path / "family"))
    if case.setup is not None:
        case.setup(fam)
    spec = fam / "spec.toml"
    spec.write_bytes(case.spec if isinstance(case.spec, bytes) else spec_text(case.spec).encode())
    pem = tmp_path / "not-a.pem"
    pem.write_text("not a PEM file\n")
    argv = [a.format(spec=spec, tmp=tmp_path, pem=pem, closed_port=free_port()) for a in case.argv or CHECK]
    code, output, unexpected = _invoke(argv, tmp_path, monkeypatch)
    _check_cli(case, code, output, unexpected, tmp_path)


# ----------------------------------------------------------------------------------------- requests


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tests.e2e.conftest import DEMO_MODELS, DEMO_SPECS, _tiny_specs
    from trtspec.backends import build
    from trtspec.builders import BuildOptions
    from trtspec.check import load_spec
    from trtspec.serve import TritonServer

    root = tmp_path_factory.mktemp("catalogue-requests")
    demo = (DEMO_MODELS / "MANIFEST.json").is_file()
    spec = load_spec(DEMO_SPECS / "lookahead.toml" if demo else _tiny_specs(root / "family")["lookahead"])
    result = build(spec, BuildOptions(out_engines=root / "engines", out_repo=root / "model_repository", progress=False))
    server = TritonServer(Path(result.repository), ready_timeout=300)
    server.start()
    try:
        yield types.SimpleNamespace(
            server=server, root=root,
            values={"$prompt": "def main():\n    " if demo else "w1 w2 w3 w4",
                    "$long": ("x = 1\n" * 600) if demo else "w5 " * 80,  # > max_input_len tokens, < the byte bound
                    "$huge": "x = 1\n" * 20000,
                    "$empty_ids": np.zeros((1, 1, 0), np.int32)})
    finally:
        code = server.stop()
    assert code == 0, f"tritonserver did not shut down cleanly (exit code {code}): {server.failure_report()}"


def _tensors(module, inputs, values):
    out = []
    for name, value, dtype in inputs:
        value = values.get(value, value) if isinstance(value, str) else value
        if isinstance(value, list):
            value = [[values.get(v, v) if isinstance(v, str) else v for v in row] for row in value]
        if dtype == "BYTES":
            array = np.asarray(value, dtype=np.object_)
            array = np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[np.object_])(array)
        else:
            array = np.asarray(value, dtype={"INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64,
                                             "BOOL": np.bool_}[dtype])
        tensor = module.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def _request(served, case: Case) -> tuple[str | None, str | None]:
    """(status, message) of the case's request: ("in-stream", msg) for an error on the stream, (code, msg) for
    a unary call's error, (None, None) when it was served."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(served.server.grpc_url)
    inputs = _tensors(grpcclient, case.inputs, served.values)
    try:
        if case.unary:
            try:
                client.infer(case.model, inputs, parameters=case.parameters, client_timeout=120)
            except InferenceServerException as exc:
                return str(exc.status()).removeprefix("StatusCode."), exc.message()
            return None, None
        responses: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        done = False
        try:
            client.async_stream_infer(case.model, inputs, parameters=case.parameters,
                                      enable_empty_final_response=True)
            while True:
                result, error = responses.get(timeout=120)
                if error is not None:
                    done = True
                    return (str(error.status()).removeprefix("StatusCode.") if error.status() else "in-stream",
                            error.message())
                if result.get_response().parameters["triton_final_response"].bool_param:
                    done = True
                    return None, None
        finally:
            client.stop_stream(cancel_requests=not done)
    finally:
        client.close()


@pytest.mark.parametrize("case", _params(REQUESTS, pytest.mark.e2e))
def test_request_case(case: Case, served, tmp_path, monkeypatch):
    if case.argv:  # the CLI against the server
        argv = [a.format(grpc_url=served.server.grpc_url) for a in case.argv]
        code, output, unexpected = _invoke(argv, tmp_path, monkeypatch)
        _check_cli(case, code, output, unexpected, tmp_path, served.root)
        return
    status, message = _request(served, case)
    samples.record(case.id, message if message is not None else "(served: no error)", f"gRPC {status}", served.root)
    assert message is not None, "the bad request was served"
    assert re.search(case.expect, message), message
    assert status == case.status, (status, message)
    assert "\n" not in message.strip() and "Traceback" not in message and ".py" not in message, message


@pytest.mark.e2e
def test_the_server_still_serves_after_every_bad_request(served):
    from trtspec.client import generate_remote

    result = generate_remote(served.server.grpc_url, served.values["$prompt"], max_tokens=8, timeout=120)
    assert result.text and result.new_tokens == 8
