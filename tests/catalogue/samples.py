"""The real messages of the catalogue's cases (samples.json), as last captured by `make catalogue`:
what docs/errors.md shows next to each case's regex. Paths of the test's temp dir and dynamic ports are
normalized ($TMP, $PORT) so that a re-capture on another machine changes nothing."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

SAMPLES = Path(__file__).with_name("samples.json")
CAPTURE_ENV = "TRTSPEC_CATALOGUE_CAPTURE"  # set (to 1) to record every case's real message into samples.json


def load() -> dict[str, dict[str, str]]:
    return json.loads(SAMPLES.read_text(encoding="utf-8")) if SAMPLES.is_file() else {}


def capturing() -> bool:
    return bool(os.environ.get(CAPTURE_ENV))


def normalize(text: str, *roots: Path) -> str:
    for root in roots:
        for form in {str(root), str(Path(root).resolve())}:
            text = text.replace(form, "$TMP")
    return re.sub(r"\b(127\.0\.0\.1|localhost):\d{4,5}\b", r"\1:$PORT", text)


def record(case_id: str, message: str, outcome: str, *roots: Path) -> None:
    """Store a case's real message (only while capturing); samples.json stays sorted, one line per case."""
    if not capturing():
        return
    data = load()
    data[case_id] = {"message": normalize(" ".join(message.split()), *roots), "outcome": outcome}
    tmp = SAMPLES.with_name(f".{SAMPLES.name}.tmp")
    tmp.write_text("{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
                                      for k, v in sorted(data.items())) + "\n}\n", encoding="utf-8")
    tmp.replace(SAMPLES)
