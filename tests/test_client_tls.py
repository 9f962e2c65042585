"""Client addresses keep their scheme: TLS is never silently dropped; TLS options and headers reach
tritonclient (checked against a stand-in client: no server needed)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.client import GrpcOptions, generate_remote, normalize_url, parse_url, resolve_url
from trtspec.client.connect import HeaderPlugin, grpc_client
from trtspec.errors import ClientError


class _Stop(Exception):
    pass


@pytest.fixture
def made(monkeypatch):
    """The arguments tritonclient.grpc.InferenceServerClient was made with (the call then stops)."""
    import tritonclient.grpc as grpcclient

    seen: dict = {}

    class Client:
        def __init__(self, url, **kwargs):
            seen.update(url=url, **kwargs)
            seen["plugins"] = []

        def register_plugin(self, plugin):
            seen["plugins"].append(plugin)

        def is_server_live(self, **kwargs):
            raise _Stop

        def close(self):
            pass

    monkeypatch.setattr(grpcclient, "InferenceServerClient", Client)
    return seen


def test_https_and_grpcs_urls_are_tls_never_plaintext(made):
    for url in ("https://llm.example:443", "grpcs://llm.example:443"):
        with pytest.raises(_Stop):
            generate_remote(url, "hi", max_tokens=4)
        assert made["url"] == "llm.example:443" and made["ssl"] is True
    with pytest.raises(_Stop):
        generate_remote("llm.example:8001", "hi", max_tokens=4)
    assert made["ssl"] is False
    assert resolve_url("grpcs://h:1/") == "grpcs://h:1"
    assert resolve_url("grpc://h:1") == "grpc://h:1"  # kept: use_tls refuses it with --ssl


def test_plaintext_only_callers_refuse_a_tls_address():
    assert normalize_url("grpc://h:1/") == "h:1" and parse_url(":8001") == (None, "localhost:8001")
    with pytest.raises(ClientError, match="asks for TLS"):
        normalize_url("https://h:1")
    with pytest.raises(ClientError, match="unknown scheme"):
        parse_url("ftp://h:1")


def test_tls_files_and_headers_reach_tritonclient(made, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    options = GrpcOptions.make(root_certs=str(ca), headers=["Authorization=Bearer t0k=n", "x-team=a"])
    client, hostport, tls = grpc_client("h:1", options)
    assert tls and made["ssl"] is True and made["root_certificates"] == str(ca)
    (plugin,) = made["plugins"]
    request = type("Request", (), {"headers": None})()
    plugin(request)
    assert request.headers == {"authorization": "Bearer t0k=n", "x-team": "a"}  # gRPC metadata is lower-case


def test_contradictions_are_errors_not_downgrades(tmp_path):
    with pytest.raises(ClientError, match="plaintext"):
        grpc_client("grpc://h:1", GrpcOptions(ssl=True))
    with pytest.raises(ClientError, match="both --private-key and --certificate-chain"):
        grpc_client("grpcs://h:1", GrpcOptions(private_key=str(tmp_path / "k.pem")))
    with pytest.raises(ClientError, match="not found"):
        grpc_client("grpcs://h:1", GrpcOptions(root_certs=str(tmp_path / "missing.pem")))
    for bad in ("novalue", "bad name=x", "grpc-timeout=1"):
        with pytest.raises(ClientError, match="header"):
            GrpcOptions.make(headers=[bad])


def test_generate_cli_passes_tls_and_headers(made, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    result = CliRunner().invoke(main, ["generate", "--url", "h:1", "--ssl", "--root-certs", str(ca),
                                       "-H", "x-proxy-auth=abc", "-p", "hi"])
    assert made["ssl"] is True and made["root_certificates"] == str(ca)
    assert isinstance(made["plugins"][0], HeaderPlugin) and made["plugins"][0].headers == {"x-proxy-auth": "abc"}
    assert result.exit_code != 0  # (the stand-in client stops the request)
    bad = CliRunner().invoke(main, ["generate", "--url", "h:1", "-H", "nope", "-p", "hi"])
    assert bad.exit_code == ClientError.exit_code and bad.output.startswith("error: bad header 'nope'")


def test_a_request_answered_with_an_error_is_not_cancelled_when_the_stream_closes(monkeypatch):
    """Regression: the error is the request's final response, so closing the stream must not cancel it (cancelling
    a finished ensemble request leaks it in Triton 2.51: the ensemble then never unloads and the server hangs at
    exit; seen after drain-deadline cuts, whose clients cancelled the request they had just got the error for)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    stopped: list[bool] = []

    class Client:
        def __init__(self, url, **kwargs):
            pass

        def is_server_live(self, **kwargs):
            return True

        def start_stream(self, callback):
            self.callback = callback

        def async_stream_infer(self, *args, **kwargs):
            self.callback(result=None, error=InferenceServerException("generation cut after 3 tokens: the server "
                                                                       "is shutting down (drain deadline reached)"))

        def stop_stream(self, cancel_requests=False):
            stopped.append(cancel_requests)

        def close(self):
            pass

    monkeypatch.setattr(grpcclient, "InferenceServerClient", Client)
    with pytest.raises(ClientError, match="shutting down"):
        generate_remote("127.0.0.1:1", "hello", max_tokens=4)
    assert stopped == [False]
