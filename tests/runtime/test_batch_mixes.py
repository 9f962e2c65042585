"""Any mix of requests batches: every method, with any mix of K, sampling settings, stop strings, end ids and
lengths, gives each request exactly what it gets alone (greedy rows token-identical, seeded sampled rows too:
a request's random stream does not depend on the batch), through generate_batch and submit with rows refilled."""

from __future__ import annotations

import threading

import pytest

from tests.runtime.family import engine
from trtspec.runtime import SamplingParams


def test_draft_model_row_moved_during_a_step_without_drafts(fam):
    """Issue #3: A (long prompt, drafting) ends and B (K = 0) moves into its row; steps where no row drafts
    must not commit A's stale draft-cache length onto B, else B's next drafting step reads past its sequence
    (`index -1 is out of bounds`) and fails every request of the batch."""
    eng = engine(fam, "draft-model", batch=2)
    a = [5 + i % 80 for i in range(50)]
    sp_b = SamplingParams(max_new_tokens=20, num_draft_tokens=0, end_id=-1)
    sp_c = SamplingParams(max_new_tokens=8, num_draft_tokens=4, end_id=-1)
    alone_b = eng.generate([3, 4], sp_b).tokens
    alone_c = eng.generate([7, 8, 9], sp_c).tokens
    ia = eng.stream(a, SamplingParams(max_new_tokens=3, num_draft_tokens=4, end_id=-1))
    ib = eng.stream([3, 4], sp_b)
    next(ia)  # A prefilled into row 0
    got_b = next(ib).tokens  # B joins row 1; A drafts, ends and frees row 0: B moves there
    assert list(ia)[-1].finished
    for _ in range(3):  # B alone, not drafting
        got_b += next(ib).tokens
    got_c = [t for ev in eng.stream([7, 8, 9], sp_c) for t in ev.tokens]  # C drafts next to B
    got_b += [t for ev in ib for t in ev.tokens]
    assert (got_b, got_c) == (alone_b, alone_c)
