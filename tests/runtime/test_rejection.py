"""The acceptance rules of the rejection sampler: exact by enumeration, and the engine's own verification
functions by Monte Carlo. Every check is also run on deliberately broken rules, which must fail it."""

from __future__ import annotations

import math

import pytest
import torch

from trtspec.runtime import rejection as R, sampling as S

V = 8


def chi2_z(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness of fit as a z-score (Wilson-Hilferty); cells with expected count < 5 are pooled."""
    n = counts.sum().item()
    exp = probs.flatten().double() * n
    obs = counts.flatten().double()
    small = exp < 5
    exp = torch.cat([exp[~small], exp[small].sum()[None]]) if small.any() else exp
    obs = torch.cat([obs[~small], obs[small].sum()[None]]) if small.any() else obs
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum().item()
    k = int(keep.sum()) - 1
    return ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))


def rand_dist(g, *shape, sharp=2.0, dtype=torch.float32):
    return torch.softmax(torch.randn(*shape, V, generator=g, dtype=torch.float64) * sharp, -1).to(dtype)


# --------------------------------------------------------------------------------- exact, by enumeration

def exact_two_tokens(p0, P1, q0, Q1, accept, resid):
    """P(first two emitted tokens) of one K=2 draft-target step, written out from the two rules.

    p0, q0 [V]: target/draft at the first position; P1, Q1 [V, V]: at the second, given the first token.
    If the first draft is rejected, the second token comes from the next (plain) step: P1[y1].
    """
    out = torch.zeros(V, V, dtype=torch.float64)
    a0 = torch.tensor([accept(p0[x], q0[x]) for x in range(V)], dtype=torch.float64)
    r0 = resid(p0, q0).double()
    reject0 = 1 - (q0.double() * a0).sum()
    for y1 in range(V):
        a1 = torch.tensor([accept(P1[y1, x], Q1[y1, x]) for x in range(V)], dtype=torch.float64)
        reject1 = 1 - (Q1[y1].double() * a1).sum()
        after_accept = Q1[y1].double() * a1 + reject1 * resid(P1[y1], Q1[y1]).double()
        out[y1] = q0[y1] * a0[y1] * after_accept + reject0 * r0[y1] * P1[y1].double()
    return out


def broken_accept_q_over_p(p_x, q_x):
    return min(1.0, float(q_x) / float(p_x)) if float(p_x) > 0 else 1.0


def broken_residual_p(p, q):
    return p


def broken_residual_q_minus_p(p, q):
    return R.residual(q, p)


@pytest.mark.parametrize("accept,resid,lossless", [
    (R.accept_probability, R.residual, True),
    (broken_accept_q_over_p, R.residual, False),
    (R.accept_probability, broken_residual_p, False),
    (R.accept_probability, broken_residual_q_minus_p, False),
])
def test_rules_reproduce_the_target_distribution_exactly(accept, resid, lossless):
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for _ in range(30):
        p0, q0 = rand_dist(g, dtype=torch.float64), rand_dist(g, dtype=torch.float64)
        P1, Q1 = rand_dist(g, V, dtype=torch.float64), rand_dist(g, V, dtype=torch.float64)
        got = exact_two_tokens(p0, P1, q0, Q1, accept, resid)
        want = p0.double()[:, None] * P1.double()
        assert abs(got.sum().item() - 1) < 1e-9
        worst = max(worst, (got - want).abs().sum().item() / 2)  # total variation
    assert (worst < 1e-9) if lossless else (worst > 0.02)


def test_point_mass_rules_are_exact_for_sibling_candidates():
    """Deterministic candidates x1, x2, x3 tested in turn against the running residual: the emitted token is
    distributed as p (and skipping the residual update between siblings is not)."""
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        p = rand_dist(g, dtype=torch.float64)
        cands = torch.randperm(V, generator=g)[:3].tolist()
        for update in (True, False):
            out, dist, left = torch.zeros(V, dtype=torch.float64), p.clone(), 1.0
            for x in cands:
                a = R.accept_probability(dist[x], 1.0)
                out[x] += left * a
                left *= 1 - a
                if update:
                    dist = R.residual(dist, R.point_mass(x, dist))
            out += left * dist
            err = (out - p).abs().sum().item() / 2
            assert (err < 1e-12) if update else (err > 1e-3)


# ------------------------------------------------------------------------- Monte Carlo of verify_sampled

def _mc_chain(n: int, seed: int):
    """n runs of the engine's verify_sampled on one K=2 draft-target step over fixed random p/q tables."""
    g = torch.Generator().manual_seed(123)
    p0, q0 = rand_dist(g, sharp=1.5), rand_dist(g, sharp=1.5)
    P1, Q1 = rand_dist(g, V, sharp=1.5), rand_dist(g, V, sharp=1.5)
    P2 = rand_dist(g, V, sharp=1.5)  # third position (bonus) given x2: any distribution
    rng = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, V)
    kids = R.children_of((-1, 0))
    for _ in range(n):
        u = torch.rand(8, generator=rng).tolist()
        x1 = int(S.sample(q0, u[0]))
        x2 = int(S.sample(Q1[x1], u[1]))
        p = torch.stack([p0, P1[x1], P2[x2]])
        q = torch.stack([q0, Q1[x1]])
        path, nxt = R.verify_sampled(p, [x1, x2], kids, q, iter(u[2:]))
        emitted = [[x1, x2][j] for j in path] + [nxt]
        if len(emitted) == 1:  # the next step samples the second token from the target
            emitted.append(int(S.sample(P1[emitted[0]], u[7])))
        counts[emitted[0], emitted[1]] += 1
    return counts, p0[:, None] * P1


def test_verify_sampled_chain_matches_target_monte_carlo():
    counts, exact = _mc_chain(20000, seed=5)
    assert chi2_z(counts, exact) < 4.0


def test_verify_sampled_chain_monte_carlo_catches_a_broken_rule(monkeypatch):
    monkeypatch.setattr(R, "residual", broken_residual_p)
    counts, exact = _mc_chain(20000, seed=5)
    assert chi2_z(counts, exact) > 8.0


def _mc_tree(n: int, seed: int):
    """Point-mass tree: root candidates [a, b, c], a has candidates [d, e]."""
    g = torch.Generator().manual_seed(7)
    p0 = rand_dist(g, sharp=1.0)
    P1 = rand_dist(g, V, sharp=1.0)
    a, b, c, d, e = 1, 2, 5, 3, 0
    tokens, parents = [a, b, c, d, e], (-1, -1, -1, 0, 0)
    kids = R.children_of(parents)
    rng = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, V)
    for _ in range(n):
        u = iter(torch.rand(16, generator=rng).tolist())
        # inputs: 0 root, 1+j node j; only input 1 (a) has children, so p at b/c/d/e inputs is never used
        p = torch.stack([p0, P1[a], P1[b], P1[c], p0, p0])
        path, nxt = R.verify_sampled(p, tokens, kids, None, u)
        emitted = [tokens[j] for j in path] + [nxt]
        if len(emitted) == 1:
            emitted.append(int(S.sample(P1[emitted[0]], next(u))))
        counts[emitted[0], emitted[1]] += 1
    return counts, p0[:, None] * P1


def test_verify_sampled_tree_of_point_masses_matches_target():
    counts, exact = _mc_tree(20000, seed=9)
    assert chi2_z(counts, exact) < 4.0


def test_verify_sampled_tree_monte_carlo_catches_missing_sibling_residual(monkeypatch):
    monkeypatch.setattr(R, "residual", lambda p, q: p)  # siblings tested against p, never the residual
    counts, exact = _mc_tree(20000, seed=9)
    assert chi2_z(counts, exact) > 8.0


def test_verify_greedy_walks_the_tree():
    # inputs: 0 root; nodes 0:[5] 1:[7] under root, 2:[9] under node 1, 3:[4] under node 2
    tokens, kids = [5, 7, 9, 4], R.children_of((-1, -1, 1, 2))
    assert R.verify_greedy([7, 0, 9, 4, 6], tokens, kids) == ([1, 2, 3], 6)
    assert R.verify_greedy([7, 0, 9, 8, 6], tokens, kids) == ([1, 2], 8)
    assert R.verify_greedy([3, 0, 9, 4, 6], tokens, kids) == ([], 3)
