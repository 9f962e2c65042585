"""Safe serving defaults against a real server: loopback bind, a model-repository API that refuses
clients without the admin key (a model load runs the uploaded model.py as the server's user), and
gRPC over TLS with the client's TLS options and headers."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess

import pytest
from click.testing import CliRunner

from tests.e2e.single import PROMPT, build_lookahead
from trtspec.cli import main
from trtspec.client import GrpcOptions, generate_remote
from trtspec.errors import ClientError, ServeError
from trtspec.repository.server_flags import ADMIN_HEADER, GRPC_ADMIN_HEADER
from trtspec.serve import GrpcTls, TritonServer, load_models

pytestmark = pytest.mark.e2e

MODEL_PY = """import pathlib
pathlib.Path({marker!r}).write_text("ran")
class TritonPythonModel:
    def execute(self, requests):
        return []
"""
CONFIG = json.dumps({"name": "uploaded", "backend": "python", "max_batch_size": 0,
                     "input": [{"name": "x", "data_type": "TYPE_INT32", "dims": [1]}],
                     "output": [{"name": "y", "data_type": "TYPE_INT32", "dims": [1]}]})


def _non_loopback_address() -> str | None:
    """An address of this machine other than loopback (the one its default route uses), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.255", 9))  # no packet is sent: this only picks the outgoing interface
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def _refused(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) != 0


def test_by_default_the_server_binds_loopback_and_model_control_needs_the_key(tmp_path):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    repo = tmp_path / "repo"
    repo.mkdir()
    marker = tmp_path / "model-py-ran"
    files = {"file:1/model.py": MODEL_PY.format(marker=str(marker)).encode()}
    server = TritonServer(repo, load_models=(), ready_timeout=60, work_dir=tmp_path / "work")
    server.start()
    try:
        argv = " ".join(server.argv)
        for flag in ("--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"):
            assert flag in argv
        address = _non_loopback_address()
        if address is not None:  # listening on loopback only: not reachable on the machine's other address
            ep = server.endpoints
            assert all(_refused(address, p) for p in (ep.http_port, ep.grpc_port, ep.metrics_port))
        grpc_c = grpcclient.InferenceServerClient(server.grpc_url)
        http_c = httpclient.InferenceServerClient(server.http_url)
        try:
            for client in (grpc_c, http_c):  # a real tritonclient load with an uploaded model.py
                with pytest.raises(InferenceServerException, match="restricted"):
                    client.load_model("uploaded", config=CONFIG, files=files)
                with pytest.raises(InferenceServerException, match="restricted"):
                    client.unload_model("uploaded")
                with pytest.raises(InferenceServerException, match="restricted"):
                    client.get_model_repository_index()
            assert not marker.exists() and not http_c.is_model_ready("uploaded")
            assert grpc_c.is_server_ready() and http_c.is_server_live()  # health and metadata stay open
            with pytest.raises(ServeError, match="restricted"):
                load_models(server.http_url, ["uploaded"], admin_key="wrong-key-0123456789")
            # with the key, model control works (over gRPC with the header name Triton expects)
            grpc_c.load_model("uploaded", config=CONFIG, files=files, headers={GRPC_ADMIN_HEADER: server.admin_key})
            assert marker.read_text() == "ran" and http_c.is_model_ready("uploaded")
            http_c.unload_model("uploaded", headers={ADMIN_HEADER: server.admin_key})
        finally:
            grpc_c.close()
            http_c.close()
    finally:
        code = server.stop()
    assert code == 0, server.failure_report()


def _self_signed(tmp_path):
    """A certificate for localhost/127.0.0.1 and its key (openssl CLI; the cryptography package is not a
    dependency)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a test certificate")
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def test_generate_over_grpc_tls_with_the_client_tls_options(tmp_path_factory, tmp_path):
    built = build_lookahead(tmp_path_factory.mktemp("tls"))
    cert, key = _self_signed(tmp_path)
    server = TritonServer(built.repository, grpc_tls=GrpcTls(cert, key), work_dir=tmp_path / "work")
    server.start()
    try:
        tls = generate_remote(f"grpcs://{server.grpc_url}", PROMPT, max_tokens=16,
                              options=GrpcOptions(root_certs=str(cert)))
        assert tls.new_tokens == 16 and tls.text
        out = CliRunner().invoke(main, ["generate", "--url", server.grpc_url, "--ssl", "--root-certs", str(cert),
                                        "-H", "x-proxy-auth=token-1", "-p", PROMPT, "-n", "16", "--json"])
        assert out.exit_code == 0, out.output
        assert json.loads(out.output)["text"] == tls.text
        with pytest.raises(ClientError, match="cannot reach"):  # a plaintext client gets no answer
            generate_remote(server.grpc_url, PROMPT, max_tokens=4, timeout=20)
        with pytest.raises(ClientError, match="TLS") as info:  # https:// is TLS: the self-signed cert fails
            generate_remote(f"https://{server.grpc_url}", PROMPT, max_tokens=4, timeout=20)
        assert "--root-certs" in info.value.hint
    finally:
        code = server.stop()
    assert code == 0, server.failure_report()
