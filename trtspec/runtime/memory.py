"""The memory budget: refuse a model or a KV cache that would not fit, before allocating it.

Linux does not fail a large allocation on an overcommitted machine: the OOM killer ends the process later,
without a word (an in-process bench of three specs of a 1.5B + 0.5B pair on 24 GB died that way). So the
loaders ask `require` first with what they are about to hold, and it raises MemoryBudgetError, naming both
numbers, when that exceeds what this process can still get:

    available = min(MemAvailable of /proc/meminfo, the cgroup's limit - its current usage)

(cgroup v2 memory.max / memory.current, else v1 memory.limit_in_bytes / memory.usage_in_bytes; the usage
less its inactive page cache, as container runtimes count a working set).
`TRTSPEC_AVAILABLE_MEMORY` (bytes, or with a K/M/G/T suffix: "6G") replaces the measurement (tests, or a
budget smaller than the machine); `0`, `off` or `none` turns the check off.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from trtspec.errors import MemoryBudgetError

ENV = "TRTSPEC_AVAILABLE_MEMORY"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
CGROUP = Path("/sys/fs/cgroup")


def parse_size(text: str) -> int:
    """'6G', '512M', '1.5G', '123456' -> bytes (binary units); ValueError otherwise."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 6G, 512M or a number of bytes)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (no limit) included


def cgroup_room() -> int | None:
    """This process's cgroup's memory limit minus its working set (usage less inactive page cache, which the
    kernel reclaims before it kills), or None without a limit."""
    v2 = v1 = "/"
    try:
        for ln in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrl, rel = ln.split(":", 2)
            v2 = rel if ln.startswith("0::") else v2
            v1 = rel if "memory" in ctrl.split(",") else v1
    except (OSError, ValueError):
        pass
    v1dir = CGROUP / "memory"
    for d, limit_f, used_f, inactive in (
            (CGROUP / v2.lstrip("/"), "memory.max", "memory.current", "inactive_file"),
            (v1dir / v1.lstrip("/"), "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
            (v1dir, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")):
        limit, used = _read_int(d / limit_f), _read_int(d / used_f)
        if limit is None or used is None or limit >= 1 << 60:  # v1 says "no limit" with a huge number
            continue
        try:
            stat = dict(ln.split() for ln in (d / "memory.stat").read_text().splitlines() if len(ln.split()) == 2)
            used -= min(used, int(stat.get(inactive, 0)))
        except (OSError, ValueError):
            pass
        return max(0, limit - used)
    return None


def available() -> tuple[int | None, str]:
    """(bytes this process can still allocate, where the number comes from); None: no check."""
    forced = os.environ.get(ENV)
    if forced is not None:
        if forced.strip().lower() in ("0", "off", "none", ""):
            return None, ENV
        try:
            return parse_size(forced), ENV
        except ValueError as e:
            raise MemoryBudgetError(f"{ENV}={forced!r}: {e}", hint="unset it, or give a size such as 6G") from None
    avail, where = None, "MemAvailable"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    room = cgroup_room()
    if room is not None and (avail is None or room < avail):
        avail, where = room, "the cgroup's memory limit"
    return avail, where


def require(need: int, what: str, hint: str | None = None) -> None:
    """Raise MemoryBudgetError if `need` bytes for `what` exceed what is available (see the module docstring)."""
    avail, where = available()
    if avail is None or need <= avail:
        return
    raise MemoryBudgetError(
        f"not enough memory for {what}: it needs {gb(need)}, {gb(avail)} is available ({where})",
        hint=hint or "free memory (stop other models or servers), serve a smaller dtype (model.dtype = "
                     "\"bfloat16\"), quantize (model.quantization = \"int8\"), or lower limits.max_batch_size / "
                     f"max_input_len / max_output_len; {ENV} overrides the measured number")
