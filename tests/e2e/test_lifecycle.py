"""Server lifecycle on a deployment's own built repository: `trtspec serve` in the background and
`--stop`, explicit-mode deploy (with the admin key), clean restart, and startup failures that report
the server log. Drain, kill -9 and cleanup: test_shutdown.py; bind and admin key: test_security.py."""

from __future__ import annotations

import glob
import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.client import generate_remote, resolve_url
from trtspec.errors import ClientError, ServeError
from trtspec.repository import pbtxt
from trtspec.repository.pbtxt import tensor
from trtspec.serve import TritonServer, load_models, unload_models
from trtspec.serve.endpoints import port_in_use

pytestmark = pytest.mark.e2e
METHOD = "lookahead"  # no drafter weights: the quickest deployment to load


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _expected(e2e) -> str:
    return generate_remote(e2e.server.grpc_url, e2e.prompts[0], max_tokens=16,
                           model=e2e.deployments[METHOD].ensemble).text


def test_cli_serve_in_background_then_stop(e2e, tmp_path, monkeypatch):
    monkeypatch.setenv("TRTSPEC_STATE_DIR", str(tmp_path / "state"))
    dep = e2e.deployments[METHOD]
    spec_path = str(dep.spec.source)
    args = ["serve", "-c", spec_path, "--repo", str(Path(dep.build.repository).parent),
            "--grpc-port", "0", "--http-port", "0", "--metrics-port", "0"]
    runner = CliRunner()
    started = runner.invoke(main, args + ["--json"])
    assert started.exit_code == 0, started.output
    state = json.loads(started.output)
    state_file = tmp_path / "state" / f"serve-{dep.spec.name}.json"
    try:
        assert "admin_key" not in state and state["http_url"].startswith("127.0.0.1:")  # not printed; loopback
        recorded = json.loads(state_file.read_text())
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600 and len(recorded["admin_key"]) >= 32
        # model control with the recorded key (load_models finds it for the server on that port)
        assert load_models(state["http_url"], [dep.spec.serving.ensemble_name], reload=True) == ["ensemble"]
        assert resolve_url(None, spec_path) == state["grpc_url"]
        result = generate_remote(resolve_url(None, spec_path), e2e.prompts[0], max_tokens=16)
        assert result.text == _expected(e2e)
        again = runner.invoke(main, args)
        assert again.exit_code == ServeError.exit_code and "already running" in again.output
    finally:
        stopped = runner.invoke(main, ["serve", "-c", spec_path, "--stop"])
    assert stopped.exit_code == 0 and "stopped" in stopped.output and "drained" in stopped.output
    assert _gone(state["pid"])
    assert not glob.glob(f"/dev/shm/{state['shm_prefix']}*")
    assert not (tmp_path / "state" / f"serve-{dep.spec.name}.json").exists()
    assert "no background server" in runner.invoke(main, ["serve", "-c", spec_path, "--stop"]).output


def test_clean_restart_on_the_same_ports(e2e):
    dep = e2e.deployments[METHOD]
    expected = _expected(e2e)
    server = TritonServer(dep.build.repository)
    server.start()
    try:
        ports = server.endpoints
        assert generate_remote(server.grpc_url, e2e.prompts[0], max_tokens=16).text == expected
        old_pid, old_prefix = server.pid, server.shm_prefix
        assert glob.glob(f"/dev/shm/{old_prefix}*")
        server.restart()
        assert server.endpoints == ports and server.pid != old_pid
        assert _gone(old_pid) and not glob.glob(f"/dev/shm/{old_prefix}*")
        assert generate_remote(server.grpc_url, e2e.prompts[0], max_tokens=16).text == expected
    finally:
        pid, prefix = server.pid, server.shm_prefix
        code = server.stop()
    assert code == 0  # a clean shutdown: nothing left in flight
    assert _gone(pid) and not glob.glob(f"/dev/shm/{prefix}*")
    assert not any(port_in_use(p) for p in (ports.http_port, ports.grpc_port, ports.metrics_port))


def test_undeploy_and_deploy_on_the_running_server(e2e):
    """Explicit model control: unload one method's ensemble and generation model, then bring the
    deployment back by loading its ensemble alone (Triton loads the steps)."""
    dep = e2e.deployments[METHOD]
    url, grpc_url = e2e.server.http_url, e2e.server.grpc_url
    expected = _expected(e2e)
    generation = f"tensorrt_llm_{METHOD}"
    with pytest.raises(ServeError, match="restricted"):  # the model-repository API needs the server's key
        unload_models(url, [dep.ensemble], admin_key="not-the-key-0123456789")
    key = e2e.server.admin_key
    unload_models(url, [dep.ensemble, generation], admin_key=key)
    try:
        with pytest.raises(ClientError, match="unknown model"):
            generate_remote(grpc_url, e2e.prompts[0], max_tokens=4, model=dep.ensemble, timeout=20)
        assert generate_remote(grpc_url, e2e.prompts[0], max_tokens=4,
                               model=e2e.deployments["eagle"].ensemble).new_tokens == 4  # others keep serving
    finally:
        assert load_models(url, [dep.ensemble], admin_key=key) == [dep.ensemble]
    assert _expected(e2e) == expected


def test_a_model_that_fails_to_load_fails_the_start_with_the_log_tail(tmp_path):
    model = tmp_path / "repo" / "broken"
    (model / "1").mkdir(parents=True)
    config = pbtxt.ModelConfig(name="broken", backend="python", max_batch_size=0)
    pbtxt.add_inputs(config, [tensor("x", "INT32", [1])])
    pbtxt.add_outputs(config, [tensor("y", "INT32", [1])])
    pbtxt.write_config(model, config)
    (model / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('boom-42')\n")
    server = TritonServer(tmp_path / "repo", ready_timeout=60, work_dir=tmp_path / "work")  # keeps the log here
    with pytest.raises(ServeError, match="boom-42") as info:
        server.start()
    assert "full log" in info.value.hint
    assert not server.is_running()
