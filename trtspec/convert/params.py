"""How the spec's `[speculative]` section maps onto TensorRT-LLM's numbers: the tree maths shared by the
methods' conversion (checkpoint `max_draft_len`, `num_eagle_layers`, ...), build flags (`--max_draft_len`)
and Triton parameters (`medusa_choices` / `eagle_choices`), and TensorRT-LLM's limit on max_draft_len.
Each method's own numbers are its row's in the trtllm-engine runtime's method table
(trtspec/backends/trtllm_engine_methods.py: `max_draft_len(spec)`, its choices).
"""

from __future__ import annotations

Choices = list[list[int]]
MAX_DRAFT_LEN = 256  # TensorRT-LLM: draft tokens per step of one engine


def draft_len_excess(max_draft_len: int) -> str | None:
    """Why TensorRT-LLM cannot take `max_draft_len` (None: it can): the one statement of the limit."""
    return f"max_draft_len {max_draft_len} > {MAX_DRAFT_LEN}" if max_draft_len > MAX_DRAFT_LEN else None


def chain(length: int) -> Choices:
    """A single greedy path of `length` tokens: [[0], [0, 0], ...]."""
    return [[0] * d for d in range(1, length + 1)]


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


def brace_choices(choices: Choices) -> str:
    """`[[0], [0, 1]]` -> `"{0}, {0, 1}"`, the form the C++ tensorrtllm backend parses
    (`utils::csvStrToVecVecInt`: split on `}`, strip a leading `{`, comma-separated ints)."""
    if not choices or any(not c for c in choices):
        raise ValueError("choices must be a non-empty list of non-empty paths")
    return ", ".join("{" + ", ".join(str(int(i)) for i in c) + "}" for c in choices)
