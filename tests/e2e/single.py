"""One small deployment for the tests that need a server of their own (security, shutdown): the demo
family with the lookahead drafter (no drafter weights: the quickest to load), built into a temp dir."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from tests.support import DEMO, demo_ready

PROMPT = "def fibonacci(n):\n    "


@dataclasses.dataclass
class Built:
    spec: object
    spec_path: Path
    out_repo: Path             # parent of model_repository/<name>/
    repository: Path           # model_repository/<name>/


def build_lookahead(root: Path) -> Built:
    if not demo_ready("target"):
        pytest.skip("demo family not trained yet")
    from trtspec.backends import build
    from trtspec.builders import BuildOptions
    from trtspec.check import load_spec

    path = DEMO / "lookahead.toml"
    spec = load_spec(path)
    result = build(spec, BuildOptions(out_engines=root / "engines", out_repo=root / "model_repository", progress=False))
    return Built(spec, path, root / "model_repository", Path(result.repository))


class Streams:
    """`n` concurrent streamed requests; `started` is set once every one has received text."""

    def __init__(self, url: str, n: int, max_tokens: int = 256, prompt: str = PROMPT, timeout: float = 120.0):
        self.pieces: list[list[str]] = [[] for _ in range(n)]
        self.results: list[object] = [None] * n
        self.done = [threading.Event() for _ in range(n)]
        self.started = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i, url, prompt, max_tokens, timeout), daemon=True)
                         for i in range(n)]
        for t in self._threads:
            t.start()

    def _run(self, i, url, prompt, max_tokens, timeout) -> None:
        from trtspec.client import generate_remote

        def on_text(piece: str) -> None:
            self.pieces[i].append(piece)
            if all(self.pieces):
                self.started.set()

        try:
            self.results[i] = generate_remote(url, prompt, max_tokens=max_tokens, on_text=on_text, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            self.results[i] = exc
        finally:
            self.done[i].set()

    def any_done(self) -> bool:
        return any(d.is_set() for d in self.done)

    def join(self, timeout: float = 180.0) -> list[object]:
        for t in self._threads:
            t.join(timeout)
        return self.results

    def text(self, i: int) -> str:
        return "".join(self.pieces[i])
