"""Built-in prompt sets for `trtspec bench --prompts builtin:NAME` (and `tune`): code, chat, edit, and mixed
(code and chat interleaved, for routing). Small on purpose: a sweep sends each prompt once per grid point.
Acceptance depends on the traffic, so benchmark with prompts like your users' (`--prompts FILE`)."""

from __future__ import annotations

CODE = [
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n\ndef main(argv):\n    ",
    "class Stack:\n    def __init__(self):\n        ",
    "def read_config(path):\n    \"\"\"Read a JSON config file.\"\"\"\n    ",
    "for i, line in enumerate(lines):\n    ",
    "def parse_args():\n    parser = argparse.ArgumentParser(",
    "    def __repr__(self):\n        return ",
    "try:\n    import json\nexcept ImportError:\n    ",
    "def merge_sorted(a, b):\n    result = []\n    ",
    "class Node:\n    def __init__(self, value, children=None):\n        ",
    "with open(filename, encoding=\"utf-8\") as f:\n    ",
    "def _check_type(value, expected):\n    if not isinstance(",
]

CHAT = [
    "What is the difference between a list and a tuple in Python?",
    "Explain what a closure is, with a short example.",
    "How do I read a file line by line?",
    "Write a short poem about the sea.",
    "What are the main causes of inflation?",
    "Give me three tips for a job interview.",
    "Why is the sky blue?",
    "Summarise the plot of a detective story in two sentences.",
    "What does HTTP status code 404 mean?",
    "How can I make my code easier to test?",
    "Describe a good morning routine.",
    "What is a hash table and when would I use one?",
]

EDIT = [
    "Rename the variable x to count:\n\nx = 0\nfor item in items:\n    x += 1\nprint(x)\n\nResult:\n",
    "Add type hints:\n\ndef add(a, b):\n    return a + b\n\nResult:\n",
    "Fix the bug:\n\ndef last(xs):\n    return xs[len(xs)]\n\nResult:\n",
    "Make it a list comprehension:\n\nout = []\nfor x in xs:\n    out.append(x * 2)\n\nResult:\n",
    "Add a docstring:\n\ndef mean(values):\n    return sum(values) / len(values)\n\nResult:\n",
    "Use a with statement:\n\nf = open(path)\ndata = f.read()\nf.close()\n\nResult:\n",
    "Replace the loop with sum():\n\ntotal = 0\nfor v in values:\n    total += v\n\nResult:\n",
    "Use f-strings:\n\nprint('%s has %d items' % (name, n))\n\nResult:\n",
]

SETS = {"code": CODE, "chat": CHAT, "edit": EDIT, "mixed": [p for pair in zip(CODE, CHAT) for p in pair]}


def builtin(name: str) -> list[str]:
    """The set `name` (KeyError lists the names for the caller's message)."""
    return list(SETS[name])
