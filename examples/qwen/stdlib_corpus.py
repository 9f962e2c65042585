"""Write the training text of the Qwen target's EAGLE-3 head (`make qwen-eagle3`): this Python's standard
library modules (the top-level `*.py` files), one {"text"} row per file in a seeded order, as a .jsonl that
`trtspec train eagle3 --data` cuts into chunks. Plain code needs no generation pass by the target.

    .venv/bin/python examples/qwen/stdlib_corpus.py OUT.jsonl
"""

from __future__ import annotations

import json
import random
import sys
import sysconfig
from pathlib import Path

from trtspec.artifacts.fs import write_bytes


def main(out: Path) -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    random.Random(0).shuffle(files)  # chunks are taken from the start: mix the modules, not a-z
    rows = [json.dumps({"text": p.read_text(encoding="utf-8", errors="replace")}) + "\n" for p in files]
    write_bytes(out, "".join(rows).encode("utf-8"))  # atomic
    print(f"wrote {out}: {len(files)} modules of {root} (Python {sys.version.split()[0]})")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
