"""How the spec's `[speculative]` section maps onto TensorRT-LLM's numbers.

One place for the tree maths shared by conversion (checkpoint `max_draft_len`,
`num_eagle_layers`, ...), the build plan (`--max_draft_len`) and the Triton repository
(`medusa_choices` / `eagle_choices` / `lookahead_*`).
"""

from __future__ import annotations

from trtspec.spec import Spec, lookahead_max_draft_len

Choices = list[list[int]]


def chain(length: int) -> Choices:
    """A single greedy path of `length` tokens: [[0], [0, 0], ...]."""
    return [[0] * d for d in range(1, length + 1)]


def medusa_choices(spec: Spec, num_heads: int) -> Choices:
    """The spec's tree, or a greedy chain as deep as the heads allow (at most num_draft_tokens)."""
    if spec.speculative.choices:
        return [list(c) for c in spec.speculative.choices]
    return chain(min(spec.speculative.num_draft_tokens, num_heads))


def eagle_choices(spec: Spec) -> Choices:
    if spec.speculative.choices:
        return [list(c) for c in spec.speculative.choices]
    return chain(spec.speculative.num_draft_tokens)


def tree_depth(choices: Choices) -> int:
    return max((len(c) for c in choices), default=0)


def max_non_leaves_per_layer(choices: Choices) -> int:
    """Most nodes with children on one level of the tree (TensorRT-LLM's EAGLE limit)."""
    nodes = {tuple(c) for c in choices}
    parents = {tuple(c[:-1]) for c in choices if len(c) > 1}
    per_level: dict[int, int] = {}
    for node in nodes & parents:
        per_level[len(node)] = per_level.get(len(node), 0) + 1
    return max([1, *per_level.values()])


def eagle_tree_params(choices: Choices) -> dict[str, int]:
    """`max_draft_len` (one draft token per node), `num_eagle_layers` (= depth), non-leaves."""
    return {"max_draft_len": len(choices), "num_eagle_layers": tree_depth(choices),
            "max_non_leaves_per_layer": max_non_leaves_per_layer(choices)}


def lookahead_params(spec: Spec) -> dict[str, int]:
    la = spec.speculative.lookahead
    return {"window": la.window, "ngram": la.ngram, "verification_set": la.verification_set,
            "max_draft_len": lookahead_max_draft_len(la.window, la.ngram, la.verification_set)}


def engine_max_draft_len(spec: Spec, num_medusa_heads: int | None = None) -> int:
    """The target engine's `max_draft_len` for the spec's method."""
    m = spec.method
    if m == "draft-model":
        return spec.speculative.num_draft_tokens
    if m == "medusa":
        return len(medusa_choices(spec, num_medusa_heads or spec.speculative.num_draft_tokens))
    if m == "eagle":
        return len(eagle_choices(spec))
    if m == "lookahead":
        return lookahead_params(spec)["max_draft_len"]
    return 0


def brace_choices(choices: Choices) -> str:
    """`[[0], [0, 1]]` -> `"{0}, {0, 1}"`, the form the C++ tensorrtllm backend parses
    (`utils::csvStrToVecVecInt`: split on `}`, strip a leading `{`, comma-separated ints)."""
    if not choices or any(not c for c in choices):
        raise ValueError("choices must be a non-empty list of non-empty paths")
    return ", ".join("{" + ", ".join(str(int(i)) for i in c) + "}" for c in choices)
