"""Loading a spec: TOML, then the schema (structure problems named by key, with a fix each), then the cross-field
rules the caller passes (trtspec.check passes every rule; by default the spec's own). All problems are raised
together as one SpecError."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trtspec.errors import SpecError
from trtspec.names import NAME_RULE
from trtspec.spec.rules import _MISSING, Problem, spec_problems
from trtspec.spec.schema import DEFAULT_SPEC, Spec

_FIXES = {
    "extra_forbidden": "remove the key or check its spelling against `trtspec init`",
    "missing": "add the key",
    "literal_error": "use one of the allowed values",
    "less_than_equal": "use a smaller value",
    "less_than": "use a smaller value",
    "greater_than_equal": "use a larger value",
    "greater_than": "use a larger value",
    "int_parsing": "write a whole number without quotes",
    "int_type": "write a whole number: no quotes, no decimal point, not true/false",
    "float_parsing": "write a number without quotes",
    "float_type": "write a number without quotes",
    "bool_parsing": "write true or false",
    "bool_type": "write true or false",
    "string_type": "write a quoted string",
    "list_type": "write a list, e.g. [[0], [0, 0]]",
    "string_pattern_mismatch": "use letters, digits, '_', '-' and '.' only",
    "path_name": f"use {NAME_RULE}",
    "path_type": "write the path as a quoted string",
    "path_nul": "remove the NUL byte (\\u0000) from the path",
    "path_home": "write the path in full, or with ~/ for your own home directory",
    "path_resolve": "point it at a directory that exists",
}


def _structure_problems(exc: ValidationError) -> list[Problem]:
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        value = err.get("input", _MISSING) if err["type"] != "missing" else _MISSING
        if isinstance(value, dict):
            value = _MISSING
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown key"
        problems.append(Problem(key, value, message, _FIXES.get(err["type"], "")))
    return problems


Rules = Callable[[Spec], list[Problem]]


def spec_from_dict(data: dict[str, Any], base: Path | None = None, source: Path | None = None, *,
                   methods: Sequence[str] | None = None, rules: Rules = spec_problems) -> Spec:
    """Validate a spec given as a dict (already parsed TOML); relative checkpoint paths resolve against `base`
    (none: kept as written). `methods`: the names speculative.method takes (None: any); `rules`: the
    cross-field rules (default: this module's, which need no method or runtime; trtspec.check passes all of
    them). Raises SpecError listing every problem."""
    where = f" in {source}" if source else ""
    try:
        spec = Spec.model_validate({**data, "source": source}, context={"base": base, "methods": methods})
    except ValidationError as exc:
        problems = _structure_problems(exc)
        raise _spec_error(problems, where) from None
    problems = rules(spec)
    if problems:
        raise _spec_error(problems, where)
    return spec


def _spec_error(problems: list[Problem], where: str) -> SpecError:
    first = problems[0]
    more = f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})" if len(problems) > 1 else ""
    message = f"{first}{where}{more}"
    return SpecError(message, hint="`trtspec check` lists every problem; `trtspec init` writes a valid example",
                     problems=[str(p) for p in problems])


def load_spec(path: str | Path = DEFAULT_SPEC, *, methods: Sequence[str] | None = None,
              rules: Rules = spec_problems) -> Spec:
    """Read and validate `trtspec.toml` (`methods`, `rules`: as spec_from_dict's; trtspec.check.load_spec passes
    them). Raises SpecError naming the key and the fix."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"spec file not found: {path}",
                        hint="pass -c/--config PATH, or run `trtspec init` to write one")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}", hint="fix the TOML syntax at the line shown") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not UTF-8 text", hint="save the spec as UTF-8") from None
    return spec_from_dict(data, base=path.resolve().parent, source=path, methods=methods, rules=rules)
