"""Link prediction's pieces: the decoders (``hector.nn.kge``) against plain-torch references
(scores and every gradient; ComplEx through torch's complex numbers), their all-entity scores
against scoring each triple; negative sampling (never the positive, one side replaced,
seeded); filtered ranks and metrics against a brute-force reference (ties, filtered
duplicates, both directions); input validation."""
import itertools

import pytest
import torch

from hector.nn.kge import ComplEx, DistMult, TransE
from hector.train.link import KnownTriples, corrupt, filtered_ranks, link_metrics

DECODERS = {"distmult": lambda r, d: DistMult(r, d), "transe1": lambda r, d: TransE(r, d, p=1),
            "transe2": lambda r, d: TransE(r, d, p=2), "complex": lambda r, d: ComplEx(r, d)}


def reference(name, h, w, t):
    """Each decoder's formula, written independently of the module."""
    if name == "distmult":
        return torch.einsum("bi,bi,bi->b", h, w, t)
    if name.startswith("transe"):
        p = int(name[-1])
        return -((h + w - t).abs() ** p).sum(1) ** (1.0 / p)
    half = h.shape[1] // 2
    c = [torch.complex(x[:, :half].double(), x[:, half:].double()) for x in (h, w, t)]
    return (c[0] * c[1] * c[2].conj()).sum(1).real


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_scores_and_gradients_equal_the_reference(name):
    torch.manual_seed(0)
    dec = DECODERS[name](5, 8).double()
    h, t = (torch.randn(7, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    r = torch.randint(0, 5, (7,))
    got = dec(h, r, t)
    want = reference(name, h, dec.rel[r], t)
    torch.testing.assert_close(got, want)
    g = torch.randn(7, dtype=torch.float64)
    ga = torch.autograd.grad(got, (h, t, dec.rel), g)
    gb = torch.autograd.grad(want, (h, t, dec.rel), g)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_all_entity_scores_equal_scoring_each_triple(name):
    torch.manual_seed(1)
    dec = DECODERS[name](4, 6).double()
    ent = torch.randn(9, 6, dtype=torch.float64, requires_grad=True)
    q, r = torch.randint(0, 9, (5,)), torch.randint(0, 4, (5,))
    tails = dec.score_tails(ent[q], r, ent)
    heads = dec.score_heads(r, ent[q], ent)
    assert tails.shape == heads.shape == (5, 9)
    for b, e in itertools.product(range(5), range(9)):
        one = torch.tensor([r[b]])
        torch.testing.assert_close(tails[b, e], dec(ent[q[b]][None], one, ent[e][None])[0])
        torch.testing.assert_close(heads[b, e], dec(ent[e][None], one, ent[q[b]][None])[0])
    # and their gradients (the ranking needs none, a full-softmax loss would)
    g = torch.randn(5, 9, dtype=torch.float64)
    got = torch.autograd.grad(tails, (ent, dec.rel), g)
    loop = torch.stack([torch.stack([dec(ent[q[b]][None], torch.tensor([r[b]]),
                                         ent[e][None])[0] for e in range(9)])
                        for b in range(5)])
    want = torch.autograd.grad(loop, (ent, dec.rel), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_decoders_check_their_inputs():
    with pytest.raises(ValueError, match="even"):
        ComplEx(3, 5)
    with pytest.raises(ValueError, match="p must be 1 or 2"):
        TransE(3, 4, p=3)
    dec = DistMult(3, 4)
    with pytest.raises(ValueError, match="dim=4"):
        dec(torch.randn(2, 5), torch.zeros(2, dtype=torch.long), torch.randn(2, 5))
    with pytest.raises(ValueError, match="one relation per row"):
        dec(torch.randn(2, 4), torch.zeros(3, dtype=torch.long), torch.randn(2, 4))


def test_negatives_replace_one_side_by_another_entity_seeded():
    triples = torch.tensor([[0, 1, 2, 3], [0, 1, 0, 2], [4, 0, 1, 1]])
    gen = torch.Generator().manual_seed(3)
    neg = corrupt(triples, 5, 50, gen)
    assert neg.shape == (3, 200)
    pos = triples.repeat_interleave(50, dim=1)
    assert torch.equal(neg[1], pos[1])                          # relations kept
    head_changed, tail_changed = neg[0] != pos[0], neg[2] != pos[2]
    assert bool((head_changed ^ tail_changed).all())            # exactly one side, never same
    assert 0.3 < head_changed.float().mean() < 0.7              # both sides drawn
    assert int(neg.min()) >= 0 and int(neg[[0, 2]].max()) < 5
    # every other entity is drawn for a side (uniform over the N - 1 others)
    drawn = set(neg[2][tail_changed & (pos[2] == 1)].tolist())
    assert drawn == {0, 2, 3, 4}
    again = corrupt(triples, 5, 50, torch.Generator().manual_seed(3))
    assert torch.equal(neg, again)
    assert not torch.equal(neg, corrupt(triples, 5, 50, torch.Generator().manual_seed(4)))
    with pytest.raises(ValueError, match="num_entities must be >= 2"):
        corrupt(triples, 1, 2)
    with pytest.raises(ValueError, match=r"\[3, T\]"):
        corrupt(triples[:2], 5, 2)


def brute_rank(scores, truth, answers):
    """The realistic filtered rank, by a loop over the entities."""
    mine = scores[truth]
    greater = equal = 0
    for e, s in enumerate(scores.tolist()):
        if e == truth or e in answers:
            continue
        greater += s > mine
        equal += s == mine
    return 1 + greater + equal / 2


@pytest.mark.parametrize("seed", range(4))
def test_filtered_ranks_equal_brute_force_with_ties(seed):
    g = torch.Generator().manual_seed(seed)
    n, r = 12, 3
    known = torch.stack([torch.randint(0, n, (60,), generator=g),
                         torch.randint(0, r, (60,), generator=g),
                         torch.randint(0, n, (60,), generator=g)])
    index = KnownTriples(known, n, r)
    queries = known[:, :20]                       # queries are known triples themselves
    scores = torch.randint(0, 4, (20, n), generator=g).double()     # many ties
    for tails in (True, False):
        key = (queries[0] if tails else queries[2]) * r + queries[1]
        truth = queries[2] if tails else queries[0]
        got = filtered_ranks(scores, truth, key, index, tails)
        for b in range(20):
            h, rel, t = queries[:, b].tolist()
            answers = {tt for hh, rr, tt in known.t().tolist() if (hh, rr) == (h, rel)} \
                if tails else {hh for hh, rr, tt in known.t().tolist() if (tt, rr) == (t, rel)}
            answers.discard(truth[b].item())
            assert got[b].item() == brute_rank(scores[b], truth[b].item(), answers)


def test_metrics_over_both_directions_equal_brute_force():
    torch.manual_seed(5)
    n, r = 10, 2
    ent = torch.randint(-2, 3, (n, 4)).double()      # integer rows: tied scores
    dec = DistMult(r, 4).double()
    with torch.no_grad():
        dec.rel.copy_(torch.randint(-1, 2, (r, 4)).double())
    known = torch.stack([torch.randint(0, n, (40,)), torch.randint(0, r, (40,)),
                         torch.randint(0, n, (40,))])
    known = torch.cat([known, known[:, :5]], 1)     # duplicated triples
    test = known[:, :15]
    got = link_metrics(ent, dec, test, KnownTriples(known, n, r), batch_size=4)
    ranks = []
    triples = set(map(tuple, known.t().tolist()))
    for h, rel, t in test.t().tolist():
        for tails in (True, False):
            scores = torch.stack([dec(ent[[h if tails else e]], torch.tensor([rel]),
                                      ent[[e if tails else t]])[0] for e in range(n)])
            truth = t if tails else h
            answers = {e for e in range(n) if ((h, rel, e) if tails else (e, rel, t)) in triples}
            answers.discard(truth)
            ranks.append(brute_rank(scores, truth, answers))
    ranks = torch.tensor(ranks, dtype=torch.float64)
    assert len(ranks) == 30
    want = {"mrr": ranks.reciprocal().mean().item(),
            **{f"hits{k}": (ranks <= k).double().mean().item() for k in (1, 3, 10)}}
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-12), k


def test_metrics_check_their_inputs():
    index = KnownTriples(torch.tensor([[0], [0], [1]]), 3, 1)
    with pytest.raises(ValueError, match="entity must be"):
        link_metrics(torch.randn(4, 2), DistMult(1, 2), torch.tensor([[0], [0], [1]]), index)
