"""Paths and markers shared by the tests (import as `from tests.support import ...`)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "examples" / "models"
DEMO = ROOT / "examples" / "demo"


def demo_ready(*names: str) -> bool:
    """The demo family's checkpoints `names` are present (e.g. demo_ready("target", "draft"))."""
    return all((MODELS / n / "config.json").is_file() for n in names)


def demo_models_present() -> bool:
    return (MODELS / "MANIFEST.json").is_file()


needs_demo_models = pytest.mark.skipif(not demo_models_present(), reason="demo family not trained yet")
