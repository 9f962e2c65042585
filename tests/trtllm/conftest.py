"""Fixtures for the TensorRT-LLM runtime tests: tiny random checkpoints, specs, the stand-in."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.support import ROOT
from tests.trtllm import fixtures as fx

FAKE = ROOT / "tests" / "data" / "fake_trtllm_build"

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Path:
    """target (GQA, 3 layers, vocab 131), draft (1 layer), medusa (4 heads), eagle (EAGLE-1)."""
    d = tmp_path_factory.mktemp("models")
    fx.make_llama(d / "target")
    fx.make_llama(d / "draft", seed=5, num_hidden_layers=1)
    fx.make_medusa(d / "medusa")
    fx.make_eagle(d / "eagle")
    return d


@pytest.fixture
def workdir(tmp_path, models) -> Path:
    """A fresh working dir with a private copy of the models (tests may edit weights)."""
    for name in ("target", "draft", "medusa", "eagle"):
        shutil.copytree(models / name, tmp_path / name)
    return tmp_path


METHOD_BODIES = {
    "draft-model": '[speculative]\nmethod = "draft-model"\ndraft = "draft"\nnum_draft_tokens = 4\n',
    "medusa": ('[speculative]\nmethod = "medusa"\nheads = "medusa"\nnum_draft_tokens = 8\n'
               'choices = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]]\n'),
    "eagle": '[speculative]\nmethod = "eagle"\nheads = "eagle"\nnum_draft_tokens = 4\n',
    "lookahead": ('[speculative]\nmethod = "lookahead"\nnum_draft_tokens = 4\n'
                  '[speculative.lookahead]\nwindow = 4\nngram = 3\nverification_set = 4\n'),
    "ngram": '[speculative]\nmethod = "ngram"\nnum_draft_tokens = 4\n[speculative.ngram]\nmax_matching = 2\n',
    "none": '[speculative]\nmethod = "none"\n',
}


def spec_text(method: str, *, name: str | None = None, dtype: str = "float16", kind: str = "trtllm-engine",
              gpu: str = 'type = "h100"', trtllm: str = "", limits: str = "", serving: str = "") -> str:
    trt = f'trtllm_build = "{FAKE}"\n' + trtllm
    return (f'[model]\nname = "{name or method}"\ntarget = "target"\ndtype = "{dtype}"\n'
            + METHOD_BODIES[method]
            + f"[limits]\n{limits or 'max_batch_size = 4'}\n"
            + f'[runtime]\nkind = "{kind}"\ndevice = "cuda"\n[runtime.trtllm]\n{trt}'
            + f"[gpu]\n{gpu}\n" + (f"[serving]\n{serving}\n" if serving else ""))


@pytest.fixture
def make_spec(workdir):
    from trtspec.check import load_spec

    def make(method: str, **kw):
        path = fx.write_spec(workdir / f"{kw.get('name') or method}.toml", spec_text(method, **kw))
        return load_spec(path)
    return make


@pytest.fixture
def build_opts(workdir):
    from trtspec.builders import BuildOptions

    def opts(**kw):
        kw.setdefault("progress", False)
        return BuildOptions(out_engines=workdir / "engines", out_repo=workdir / "model_repository", **kw)
    return opts


@pytest.fixture
def record(tmp_path, monkeypatch) -> Path:
    """The stand-in appends one JSON line per invocation here."""
    path = tmp_path / "fake_calls.jsonl"
    monkeypatch.setenv("FAKE_TRTLLM_BUILD_RECORD", str(path))
    for var in ("FAKE_TRTLLM_BUILD_FAIL", "FAKE_TRTLLM_BUILD_SLEEP", "FAKE_TRTLLM_VERSION"):
        monkeypatch.delenv(var, raising=False)
    return path


def calls(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


os.environ.setdefault("OMP_NUM_THREADS", "1")
