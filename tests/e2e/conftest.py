"""End-to-end fixtures: build every method's deployment with `trtspec build`, then serve all four from
ONE real Triton server (the bundled tritonserver) for the whole session.

Models: the demo family (examples/demo/*.toml) when examples/models/ holds its weights, else a tiny
random family made in a temp dir in the formats the runtime reads (tests/runtime/family.py), with a
draft that is a noisy copy of the target so that drafts do get accepted.

The shared repository holds one `preprocessing` and one `postprocessing` (the methods share the
tokenizer and limits) and, per method M, `tensorrt_llm_M` and `ensemble_M`.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.request
from pathlib import Path

import pytest

from tests.runtime import family as tiny
from trtspec.backends import build
from trtspec.builders import BuildOptions, BuildResult
from trtspec.check import load_spec
from trtspec.repository.torch_repo import ModelNames, emit_torch_repository
from trtspec.serve import TritonServer
from trtspec.spec import Spec

ROOT = Path(__file__).resolve().parents[2]

METHODS = ["draft-model", "medusa", "eagle", "lookahead"]
DEMO_SPECS = ROOT / "examples" / "demo"
DEMO_MODELS = ROOT / "examples" / "models"

pytestmark = pytest.mark.e2e


def key(method: str) -> str:
    return method.replace("-", "_")


@dataclasses.dataclass
class Deployment:
    method: str
    spec: Spec                 # the spec as written by the user
    build: BuildResult
    ensemble: str              # its ensemble in the shared repository

    @property
    def engine_dir(self) -> Path:
        return Path(self.build.engines["target"]).parent

    @property
    def served_spec(self) -> Spec:
        from trtspec.repository.serving import load_engine_spec

        return load_engine_spec(self.engine_dir)


@dataclasses.dataclass
class E2E:
    server: TritonServer
    deployments: dict[str, Deployment]
    prompts: list[str]
    long_prompt: str
    demo: bool
    routed: Deployment | None = None  # a routed spec (two drafters), beside `deployments`: test_operate.py

    def metrics(self) -> dict[tuple[str, str], float]:
        """spec_dec_* samples as {(name, method): value}."""
        text = urllib.request.urlopen(self.server.metrics_url, timeout=10).read().decode()
        out = {}
        for name, labels, value in re.findall(r"^(spec_dec_\w+)\{([^}]*)\} (\S+)$", text, re.M):
            method = re.search(r'method="([^"]*)"', labels).group(1)
            out[(name, method)] = float(value)
        return out


def _tiny_specs(root: Path) -> dict[str, Path]:
    tiny.build_family(root)
    tiny.save_noisy_copy(root / "target", root / "draft_near", noise=0.01, seed=7)
    specs = {}
    for method in METHODS:
        lines = ["schema = 1", "[model]", f'name = "e2e-{method}"', 'target = "target"', 'dtype = "float32"',
                 "[speculative]", f'method = "{method}"', f"num_draft_tokens = {3 if method == 'medusa' else 4}"]
        if method == "draft-model":
            lines.append('draft = "draft_near"')
        if method in ("medusa", "eagle"):
            lines.append(f'heads = "{method}"')
        lines += ["[limits]", "max_batch_size = 4", "max_input_len = 64", "max_output_len = 64"]
        path = root / f"{method}.toml"
        path.write_text("\n".join(lines) + "\n")
        specs[method] = path
    return specs


def _tiny_routed(root: Path) -> Path:
    """The tiny family's routed spec: the near draft for prose, prompt lookup for code (as
    examples/demo/routed.toml)."""
    path = root / "routed.toml"
    path.write_text('schema = 1\n[model]\nname = "e2e-routed"\ntarget = "target"\ndtype = "float32"\n'
                    '[speculative]\nmethod = "routed"\n'
                    '[[speculative.drafters]]\nname = "prose"\nmethod = "draft-model"\ndraft = "draft_near"\n'
                    '[[speculative.drafters]]\nname = "code"\nmethod = "ngram"\n'
                    '[speculative.router]\ndefault = "prose"\nroutes = {code = "code", prose = "prose"}\n'
                    '[limits]\nmax_batch_size = 4\nmax_input_len = 64\nmax_output_len = 64\n')
    return path


@pytest.fixture(scope="session")
def e2e(tmp_path_factory) -> E2E:
    root = tmp_path_factory.mktemp("e2e")
    demo = (DEMO_MODELS / "MANIFEST.json").is_file()
    spec_paths = {m: DEMO_SPECS / f"{m}.toml" for m in METHODS} if demo else _tiny_specs(root / "family")
    options = BuildOptions(out_engines=root / "engines", out_repo=root / "model_repository", progress=False)
    shared = root / "shared_repository"
    deployments = {}
    for method, path in spec_paths.items():
        spec = load_spec(path)
        result = build(spec, options)
        names = ModelNames(generation=f"tensorrt_llm_{key(method)}", ensemble=f"ensemble_{key(method)}")
        emit_torch_repository(spec, shared, Path(result.engines["target"]).parent, names=names)
        deployments[method] = Deployment(method, spec, result, names.ensemble)
    spec = load_spec(DEMO_SPECS / "routed.toml" if demo else _tiny_routed(root / "family"))
    result = build(spec, options)
    names = ModelNames(generation="tensorrt_llm_routed", ensemble="ensemble_routed")
    emit_torch_repository(spec, shared, Path(result.engines["target"]).parent, names=names)
    routed = Deployment("routed", spec, result, names.ensemble)
    if demo:
        prompts = ["def fibonacci(n):\n    ", "import os\nimport sys\n\n", "class Stack:\n    def __init__(self"]
    else:
        prompts = ["w1 w2 w3 w4 w5", "w10 w20 w30", "w7 w7 w8 w9 w10 w11 w12"]
    limit = next(iter(deployments.values())).spec.limits.max_input_len
    long_prompt = ("w5 " if not demo else "x = 1\n") * (limit + 8)
    server = TritonServer(shared, ready_timeout=300)
    server.start()
    try:
        yield E2E(server, deployments, prompts, long_prompt, demo, routed)
    finally:
        code = server.stop()
    # exit code 0: every model unloaded within the exit timeout, i.e. no request was left hanging
    assert code == 0, f"tritonserver did not shut down cleanly (exit code {code}): {server.failure_report()}"


@pytest.fixture(scope="session")
def local_engines(e2e):
    """In-process SpecEngines on the same served weights (for the identity checks)."""
    from trtspec import methods

    engines: dict[str, object] = {}

    def get(method: str):
        if method not in engines:
            engines[method] = methods.engine(e2e.deployments[method].served_spec)
        return engines[method]

    yield get
    for engine in engines.values():
        engine.close()


# ------------------------------------------------------------------------------------------------
# Two versions of one deployment, for the deploy tests (test_deploy_traffic.py, test_deploy_restart.py)
# ------------------------------------------------------------------------------------------------

VERSIONS_NAME = "deploy-versions"


@dataclasses.dataclass
class VersionBuild:
    """A `trtspec build` of the deployment VERSIONS_NAME (read only: copy it to change it)."""

    spec: Spec
    root: Path                         # parent of model_repository/ and engines/

    def model_py(self, model: str) -> Path:
        return self.root / "model_repository" / VERSIONS_NAME / model / "1" / "model.py"


def build_version(root: Path, target: str, k: int) -> VersionBuild:
    """The demo `target` checkpoint with lookahead and K = `k`, named VERSIONS_NAME, built under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "trtspec.toml"
    path.write_text("\n".join([
        "schema = 1", "[model]", f'name = "{VERSIONS_NAME}"', f'target = "{(DEMO_MODELS / target).as_posix()}"',
        'dtype = "float32"', "[speculative]", 'method = "lookahead"', f"num_draft_tokens = {k}",
        "[limits]", "max_batch_size = 4", "max_input_len = 64", "max_output_len = 64"]) + "\n")
    spec = load_spec(path)
    build(spec, BuildOptions(out_engines=root / "engines", out_repo=root / "model_repository", progress=False))
    return VersionBuild(spec, root)


@pytest.fixture(scope="session")
def versions(tmp_path_factory) -> tuple[VersionBuild, VersionBuild]:
    """v1 = the demo target with the lookahead drafter (K=4), v2 = the 2-layer draft checkpoint as the target
    (K=2): one deployment name, as a model update keeps it; each greedy text tells which version served it."""
    from tests.support import demo_ready

    if not demo_ready("target", "draft"):
        pytest.skip("demo family not trained yet")
    root = tmp_path_factory.mktemp("versions")
    return build_version(root / "v1", "target", 4), build_version(root / "v2", "draft", 2)
