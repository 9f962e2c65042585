"""`trtspec deploy` under traffic: streaming greedy requests run without a pause against the serving
ensemble of a real Triton server (started here, admin key, explicit mode) while (a) a changed build
is deployed (another checkpoint and another K, so each response tells which version served it) and
(b) builds that must fail are deployed: a lossy drafter the smoke test catches, a model.py that does
not load, and one that loads as the candidate but not under the serving names (the switch is undone).
No request may fail, every text must be the greedy output of the old or the new version, and
afterwards (a) the new version serves, (b) the old one still does, untouched. The counts of requests
during each deploy are printed (`-s`).

Demo family: v1 = the target with the lookahead drafter (K=4), v2 = the 2-layer draft checkpoint as
the target (K=2); both keep the deployment's name, as a model update does."""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import VersionBuild as Build
from trtspec.client import generate_remote
from trtspec.errors import DeployError
from trtspec.serve import TritonServer
from trtspec.serve.control import ModelControl
from trtspec.serve.deploy import CANDIDATE_SUFFIX, REVISION_PARAM, Layout, deploy_spec

pytestmark = pytest.mark.e2e
PROMPT = "def fibonacci(n):\n    "
TOKENS = 24
CLIENTS = 2
MODELS = ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing")

# A lossy speculation bug: requests that speculate (K != 0) stop one token early. It loads and serves,
# so only the smoke test's speculative-vs-plain identity can catch it.
LOSSY = """
import dataclasses as _dc
_parse = TritonPythonModel.parse
def _lossy_parse(self, request):
    ids, params, *rest = _parse(self, request)  # (ids, params, streaming, task)
    if params.num_draft_tokens != 0:
        params = _dc.replace(params, max_new_tokens=max(1, params.max_new_tokens - 1))
    return (ids, params, *rest)
TritonPythonModel.parse = _lossy_parse
"""
# Loads under the candidate name, fails under the serving one: the switch itself fails and is undone.
SERVING_FAILS = f"""
_initialize = TritonPythonModel.initialize
def _candidate_only(self, args):
    if not args["model_name"].endswith("{CANDIDATE_SUFFIX}"):
        raise RuntimeError("fails-when-serving-3")
    _initialize(self, args)
TritonPythonModel.initialize = _candidate_only
"""


def _variant(base: Build, root: Path, tail: str) -> Build:
    """A copy of `base`'s build whose generation model.py has `tail` appended."""
    shutil.copytree(base.root, root)
    build = Build(base.spec, root)
    path = build.model_py("tensorrt_llm")
    path.write_text(path.read_text() + tail)
    return build


class Traffic:
    """CLIENTS threads sending streaming greedy requests back to back until stopped; each request is
    recorded as (start, end, text or the exception)."""

    def __init__(self, url: str, model: str):
        self.url, self.model = url, model
        self.records: list[tuple[float, float, object]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CLIENTS)]

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        while len(self.records) < CLIENTS:  # every client got through once before the deploy starts
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                outcome: object = generate_remote(self.url, PROMPT, max_tokens=TOKENS, model=self.model,
                                                  on_text=lambda _: None, timeout=120).text
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                outcome = exc
            self.records.append((start, time.monotonic(), outcome))

    def during(self, start: float, end: float) -> list[object]:
        """The outcomes of the requests that overlapped [start, end]."""
        return [o for s, e, o in list(self.records) if s <= end and e >= start]


@dataclasses.dataclass
class Live:
    server: TritonServer
    repo: Path                         # the server's model repository (--server-repo)
    v1: Build
    v2: Build
    unclean_exit: str | None = None    # why the server may not exit cleanly (see the last test)

    def deploy(self, build: Build, **kwargs):
        return deploy_spec(build.spec, self.server.http_url, self.repo, grpc_url=self.server.grpc_url,
                           smoke_prompt=PROMPT, smoke_tokens=TOKENS, out_repo=build.root / "model_repository",
                           out_engines=build.root / "engines", admin_key=self.server.admin_key, **kwargs)

    def served(self) -> str:
        return generate_remote(self.server.grpc_url, PROMPT, max_tokens=TOKENS, model="ensemble").text

    def revisions(self) -> dict[str, str]:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.server.http_url)
        try:
            return {m: client.get_model_config(m).get("parameters", {}).get(REVISION_PARAM, {}).get("string_value")
                    for m in ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing")}
        finally:
            client.close()

    def backups(self) -> list[Path]:
        return sorted(Layout(self.repo).backups.iterdir())

    def leftovers(self) -> list[str]:
        """Anything but the models in the repository (a candidate), and any stage dir beside it."""
        return sorted(p.name for p in self.repo.iterdir() if p.name not in MODELS) + sorted(
            p.name for p in Layout(self.repo).stages.iterdir())


@pytest.fixture(scope="module")
def live(tmp_path_factory, versions):
    root = tmp_path_factory.mktemp("deploy_traffic")
    v1, v2 = versions
    repo = root / "server_repo"
    repo.mkdir()
    server = TritonServer(repo, load_models=(), ready_timeout=120, drain_timeout=5, work_dir=root / "work")
    server.start()
    live = Live(server, repo, v1, v2)
    try:
        assert live.deploy(v1).strategy == "in place"  # nothing served yet
        yield live
    finally:
        code = server.stop()
    assert code == 0 or live.unclean_exit, f"tritonserver did not shut down cleanly: {server.failure_report()}"


def _deploy_under_traffic(live: Live, build: Build, **kwargs):
    """Deploy `build` while Traffic runs; (result or DeployError, outcomes during the deploy, all outcomes)."""
    with Traffic(live.server.grpc_url, "ensemble") as traffic:
        start = time.monotonic()
        try:
            outcome: object = live.deploy(build, **kwargs)
        except DeployError as exc:
            outcome = exc
        end = time.monotonic()
        time.sleep(0.5)  # a few requests after the switch too
    return outcome, traffic.during(start, end), [o for _, _, o in traffic.records]


def test_a_good_deploy_under_traffic_fails_no_request_and_switches_to_the_new_version(live):
    old_text = live.served()  # v1, deployed by the fixture
    result, during, outcomes = _deploy_under_traffic(live, live.v2)
    assert not isinstance(result, Exception), result
    failed = [o for o in outcomes if isinstance(o, Exception)]
    new_text = result.smoke.text
    print(f"\ngood deploy: {len(during)} requests during the {result.seconds:.1f}s deploy, {len(outcomes)} in all, "
          f"{len(failed)} failed; old text {sum(o == old_text for o in outcomes)}, "
          f"new text {sum(o == new_text for o in outcomes)}")
    assert not failed, failed[:3]
    assert len(during) >= CLIENTS  # the deploy did run under traffic
    assert new_text != old_text  # another checkpoint: each response tells which version served it
    assert all(o in (old_text, new_text) for o in outcomes), {o for o in outcomes} - {old_text, new_text}
    assert outcomes[-1] == new_text and live.served() == new_text
    assert result.strategy == "candidate" and set(live.revisions().values()) == {result.revision}
    assert result.backup and (Path(result.backup) / "tensorrt_llm" / "1" / "model.py").is_file()
    assert not live.leftovers()


def _assert_untouched(live: Live, build: Build, step: str, cause: str, undone: str) -> None:
    """Deploy `build` under traffic: it fails at `step`, and the serving version never changes."""
    before_text, before_rev = live.served(), live.revisions()
    good_source = (live.repo / "tensorrt_llm" / "1" / "model.py").read_bytes()
    backups = live.backups()
    error, during, outcomes = _deploy_under_traffic(live, build)
    failed = [o for o in outcomes if isinstance(o, Exception)]
    print(f"\nfailing deploy ({step}): {len(during)} requests during the deploy, {len(outcomes)} in all, "
          f"{len(failed)} failed")
    assert not failed, failed[:3]
    assert len(during) >= CLIENTS
    assert all(o == before_text for o in outcomes)
    assert isinstance(error, DeployError), error
    assert f"failed at the {step}" in error.message and cause in error.message, error.message
    assert "rolled back" in error.message and undone in error.message, error.message
    assert "\n" not in error.message and error.exit_code == 5
    # the serving version is as it was: same revision, files and backups; no candidate is left, and no
    # failed one keeps the server from reporting ready (to a load balancer's health check)
    assert live.revisions() == before_rev and live.served() == before_text
    with ModelControl(live.server.http_url) as health:
        assert health.server_ready()
    assert (live.repo / "tensorrt_llm" / "1" / "model.py").read_bytes() == good_source
    assert live.backups() == backups
    assert not live.leftovers()


def test_failing_candidates_under_traffic_leave_the_serving_version_untouched(live, tmp_path):
    lossy = _variant(live.v2, tmp_path / "lossy", LOSSY)
    _assert_untouched(live, lossy, "candidate smoke test", "outputs differ", "not touched")
    broken = _variant(live.v2, tmp_path / "broken", "\nraise RuntimeError('broken-build-7')\n")
    _assert_untouched(live, broken, "candidate load", "broken-build-7", "not touched")


def test_a_failed_switch_under_traffic_is_undone(live, tmp_path):
    """Last in this module: Triton 2.51 cannot shut down cleanly once an in-place reload has failed."""
    build = _variant(live.v2, tmp_path / "serving", SERVING_FAILS)
    live.unclean_exit = "a failed in-place reload leaves Triton 2.51 unable to unload everything at exit"
    _assert_untouched(live, build, "switch", "fails-when-serving-3",
                      "the previous files are back and the previous version serves")
