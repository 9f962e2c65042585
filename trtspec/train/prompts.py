"""Builtin prompt sets for drafter training (`trtspec train ... --data builtin:NAME`), offline and deterministic:
the target answers them itself and its answers are the training data, as the EAGLE-3 trainers regenerate
ShareGPT/UltraChat responses with the target (SpecForge's `regenerate`).

    builtin:chat   general questions: topics x question templates          (~600 prompts)
    builtin:code   programming tasks: tasks x languages / phrasings        (~500 prompts)
    builtin:mix    both, interleaved (the default)

Each set is split by a fixed rule: prompt i is held out when i % HELDOUT_EVERY == 0 (held-out prompts
measure acceptance in the training manifest and are never trained on). The benchmark prompts of
examples/smollm2/{chat,code}.jsonl are not in any set (tests/train check it).
"""

from __future__ import annotations

import itertools

HELDOUT_EVERY = 20

TOPICS = (
    "photosynthesis", "the French Revolution", "black holes", "compound interest", "the immune system",
    "machine learning", "the stock market", "volcanoes", "the Roman Empire", "vaccines", "electric cars",
    "the printing press", "plate tectonics", "inflation", "DNA", "the internet", "renewable energy",
    "the Renaissance", "earthquakes", "the human heart", "gravity", "democracy", "coral reefs", "sleep",
    "the moon landing", "antibiotics", "recycling", "the Great Wall of China", "meditation", "quantum computers",
    "bees", "the Industrial Revolution", "supply and demand", "rainbows", "the nervous system", "jazz music",
    "solar panels", "the Olympic Games", "tides", "nutrition", "the Cold War", "cryptocurrency", "glaciers",
    "public speaking", "the periodic table", "time management", "deserts", "the ancient Egyptians",
    "friendship", "budgeting", "the speed of light", "rain forests", "learning a new language", "magnets",
    "the Silk Road", "exercise", "hurricanes", "chess", "the theory of evolution", "clouds",
)
QUESTIONS = (
    "What is {t}?", "Explain {t} in simple terms.", "Give me three interesting facts about {t}.",
    "Why is {t} important?", "Write a short paragraph about {t}.", "How would you explain {t} to a child?",
    "What are common misconceptions about {t}?", "Summarize the history of {t} in a few sentences.",
    "List the pros and cons of {t}.", "Write a haiku about {t}.",
)
TASKS = (
    "sorts a list of numbers with bubble sort", "finds the largest element of a list", "computes a factorial",
    "checks whether two strings are anagrams", "removes duplicates from a list", "converts Celsius to Fahrenheit",
    "computes the greatest common divisor of two numbers", "reads a file and counts its lines",
    "finds the second smallest number in a list", "capitalizes every word in a sentence",
    "implements binary search", "returns the sum of the digits of a number", "transposes a matrix",
    "validates an email address with a regular expression", "computes the average of a list",
    "finds the most common character in a string", "generates all permutations of a string",
    "implements a queue with two stacks", "checks whether a year is a leap year", "rotates a list by k positions",
    "parses a CSV line into fields", "computes the power set of a set", "converts a number to binary",
    "implements quicksort", "finds all even numbers in a list", "counts the vowels in a string",
    "merges two dictionaries", "computes the dot product of two vectors", "checks for balanced parentheses",
    "implements a simple LRU cache", "computes the n-th triangular number", "splits a list into chunks of size n",
    "finds the intersection of two lists", "converts a string to title case", "implements insertion sort",
    "computes the median of a list", "checks whether a list is sorted", "finds the longest word in a sentence",
    "computes the length of the longest common prefix of strings", "implements a binary tree insert",
    "sums all numbers in a nested dictionary", "returns the prime factors of a number",
    "formats a number with thousands separators", "computes the Levenshtein distance of two strings",
    "counts the occurrences of each word in a text", "shuffles a list in place", "implements matrix multiplication",
    "finds the missing number in a sequence 1..n", "converts a Roman numeral to an integer",
    "computes the running sum of a list",
)
CODE = (
    "Write a Python function that {t}.", "Write a JavaScript function that {t}.", "Write a C function that {t}.",
    "Show me Python code that {t}, with a short explanation.", "How do I write a function that {t} in Python?",
    "Write a Python function that {t}, with type hints and a docstring.", "Write a Rust function that {t}.",
    "Write a Go function that {t}.", "Write a Python one-liner that {t}.", "Write unit tests for a function that {t}.",
)
SETS = ("chat", "code", "mix")


def prompt_set(name: str) -> list[str]:
    """Every prompt of a builtin set, in its fixed order."""
    chat = [q.format(t=t) for t, q in itertools.product(TOPICS, QUESTIONS)]
    code = [c.format(t=t) for t, c in itertools.product(TASKS, CODE)]
    if name == "chat":
        return chat
    if name == "code":
        return code
    if name == "mix":
        return [p for pair in itertools.zip_longest(chat, code) for p in pair if p is not None]
    raise KeyError(name)


def split(prompts: list[str]) -> tuple[list[str], list[str]]:
    """(train, held out): prompt i is held out when i % HELDOUT_EVERY == 0."""
    return ([p for i, p in enumerate(prompts) if i % HELDOUT_EVERY],
            [p for i, p in enumerate(prompts) if i % HELDOUT_EVERY == 0])
