"""The background server's state file and `serve --stop` without a server: the recorded pid is signalled
only when it is still the server trtspec started (pid reuse), and the file, which holds the admin key,
is written 0600 and atomically."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
from click.testing import CliRunner

from tests.support import DEMO
from trtspec.cli import main
from trtspec.serve.processes import is_our_server, proc_cmdline, proc_start_time
from trtspec.state import read_state, state_path, write_state

SPEC = DEMO / "lookahead.toml"
NAME = "demo-lookahead"


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTSPEC_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def _record(pid: int, **extra) -> None:
    write_state(state_path(NAME), {"pid": pid, "shm_prefix": "trtspec_1_0badc0de_", "name": NAME, **extra})


@pytest.mark.parametrize("recorded", ["full", "legacy"])
def test_stop_never_signals_a_process_that_is_not_the_recorded_server(state_dir, sleeper, recorded):
    """The pid of the recorded server now belongs to `sleep`: --stop leaves it alone and drops the state."""
    if recorded == "full":  # what trtspec records: the server's start time and command line
        _record(sleeper.pid, start_time=(proc_start_time(sleeper.pid) or 0) - 1,
                cmdline=["/opt/tritonserver/bin/tritonserver", "--model-repository=/x"])
    else:  # a state of an older trtspec: pid only (matched by the shm prefix on the command line)
        _record(sleeper.pid)
    result = CliRunner().invoke(main, ["serve", "-c", str(SPEC), "--stop"])
    assert result.exit_code == 0, result.output
    assert "was not signalled" in result.output and "sleep 600" in result.output
    assert sleeper.poll() is None  # still running: no SIGTERM, no SIGKILL
    assert not state_path(NAME).exists()


def test_stop_after_the_server_died_cleans_its_stubs_and_shared_memory(state_dir):
    """kill -9 of the server: --stop finds nothing to signal but removes what it left."""
    import sys

    dead = subprocess.Popen(["true"])
    dead.wait()
    prefix = "trtspec_1_0badc0de_"
    stub = subprocess.Popen(["bash", "-c", 'exec -a /x/triton_python_backend_stub "$0" -c "import time; '
                             'time.sleep(600)" model.py "$1"', sys.executable, f"{prefix}region"])
    shm = f"/dev/shm/{prefix}region"
    open(shm, "wb").close()
    try:
        _record(dead.pid, start_time=1, cmdline=["tritonserver"])
        result = CliRunner().invoke(main, ["serve", "-c", str(SPEC), "--stop"])
        assert result.exit_code == 0, result.output
        assert "was not running" in result.output and "cleaned up 1 stub process(es), 1 shared-memory file(s)" \
            in result.output
        stub.wait(timeout=10)
        assert not os.path.exists(shm) and not state_path(NAME).exists()
    finally:
        stub.kill()
        if os.path.exists(shm):
            os.unlink(shm)


def test_the_state_file_is_private_and_written_whole(state_dir):
    path = write_state(state_path(NAME), {"pid": 1, "admin_key": "k" * 32})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    write_state(path, {"pid": 2})
    assert read_state(path) == {"pid": 2} and sorted(os.listdir(path.parent)) == [path.name]  # no temp file left
    path.write_text("{broken")
    assert read_state(path) is None


def test_process_identity_is_start_time_and_command_line(sleeper):
    start, argv = proc_start_time(sleeper.pid), proc_cmdline(sleeper.pid)
    assert argv == ["sleep", "600"] and start
    assert is_our_server(sleeper.pid, start, argv)
    assert not is_our_server(sleeper.pid, start + 1, argv) and not is_our_server(sleeper.pid, start, ["sleep", "1"])
    assert not is_our_server(sleeper.pid, None, None)


def test_binding_elsewhere_or_opening_model_control_is_warned_and_bad_values_refused(state_dir, capsys):
    from trtspec.cli.serve import _safety_warnings

    _safety_warnings("127.0.0.1", False)
    assert capsys.readouterr().err == ""
    _safety_warnings("0.0.0.0", True)
    err = capsys.readouterr().err
    assert "warning: binding 0.0.0.0: the server is reachable from other machines" in err
    assert "warning: --open-model-control" in err
    runner = CliRunner()
    bad_host = runner.invoke(main, ["serve", "-c", str(SPEC), "--host", "0.0.0.0:80"])
    assert bad_host.exit_code == 5 and bad_host.output.startswith("error: bad bind address '0.0.0.0:80'")
    short_key = runner.invoke(main, ["serve", "-c", str(SPEC), "--admin-key", "short"])
    assert short_key.exit_code == 5 and "admin key must be 16-256 characters" in short_key.output


def test_stop_without_a_recorded_server(state_dir):
    result = CliRunner().invoke(main, ["serve", "-c", str(SPEC), "--stop", "--json"])
    assert result.exit_code == 0 and json.loads(result.output) == {"stopped": False, "outcome": None, "state": None}


def test_foreground_serve_beside_a_running_background_server_is_a_serve_error(tmp_path, monkeypatch):
    """A second `serve --foreground` for a deployment whose background server runs exits 5 (a serve problem)
    with one error line and a hint, not click's usage block."""
    from click.testing import CliRunner

    from trtspec.cli import main

    spec = tmp_path / "s.toml"
    (tmp_path / "t").mkdir()
    spec.write_text('schema = 1\n[model]\nname = "m"\ntarget = "t"\n[speculative]\nmethod = "none"\n')
    monkeypatch.setattr("trtspec.serve.bundled.running_state", lambda name: {"pid": 1, "grpc_url": "x"})
    result = CliRunner().invoke(main, ["serve", "-c", str(spec), "--foreground"])
    assert result.exit_code == 5, result.output
    assert "error: a background server for 'm' is running" in result.output
    assert "hint:" in result.output


@pytest.mark.parametrize("bind, want", [("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("::", "::1"),
                                        ("127.0.0.1", "127.0.0.1"), ("10.1.2.3", "10.1.2.3"), ("node-7", "node-7")])
def test_a_client_reaches_a_wildcard_bind_on_loopback(bind, want):
    from trtspec.serve.endpoints import connect_host

    assert connect_host(bind) == want
