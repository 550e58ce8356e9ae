"""The filtered-ranking kernel (``hector.kernels.ranking``) against its torch reference and a
per-query brute force: the three score kinds, several programs along both grid axes (B and N
not multiples of the blocks), 16-bit rows (float64 ones take the reference), exact ties
(duplicate entity rows, all-zero rows), filtered lists holding the truth, duplicates, nothing,
or every other entity; argument checks; ``link_metrics`` with the kernel against the torch
path for each decoder.  Small sizes: the kernel runs under Triton's interpreter without a
GPU."""
import pytest
import torch

from hector.kernels.ranking import filtered_ranks, scores_torch
from hector.kernels.ranking.op import BLOCKS, launch_rank_counts, rank_counts_op
from hector.kernels.ranking.reference import filtered_ranks_torch
from hector.nn.kge import ComplEx, DistMult, TransE
from hector.train.link import KnownTriples, link_metrics

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")    # interpreter chatter
#: Where the kernel runs: the GPU, else Triton's interpreter (set by conftest).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KINDS = ("dot", "l1", "l2")
B, N, D = 37, 203, 24


def _filters(g, b, n, truth):
    """A CSR of filtered entities per query: random lists (some holding the truth, some
    repeating an id), empty ones, and query 3 filtering every entity but its truth."""
    lists = []
    for i in range(b):
        size = int(torch.randint(0, 6, (1,), generator=g)) if i % 4 else 0
        ids = torch.randint(0, n, (size,), generator=g).tolist()
        if i % 5 == 1:
            ids += [int(truth[i])]
        if i % 7 == 2 and ids:
            ids += [ids[0], ids[0]]
        lists.append(ids)
    lists[3] = list(range(n))
    lists[8] = lists[9] = [1, 2, 3, 4]            # the same list in two rows
    ptr = torch.tensor([0] + [len(x) for x in lists]).cumsum(0)
    return ptr, torch.tensor([c for x in lists for c in x], dtype=torch.long), lists


def _integer_case(seed, dtype=torch.float32, b=B, n=N, d=D):
    """Small-integer rows: every score is exact in any order of summation (so any two
    implementations tie where the brute force does), and ties are many."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-2, 3, (b, d), generator=g).to(dtype)
    ent = torch.randint(-2, 3, (n, d), generator=g).to(dtype)
    ent[10:20] = 0                                 # all-zero rows
    truth = torch.randint(0, n, (b,), generator=g)
    ent[40:44] = ent[truth[0]]                     # duplicates of a truth row
    truth[5] = 12                                  # a zero row as the truth
    q[6] = 0                                       # every dot score 0: the truth mid-way
    ptr, col, lists = _filters(g, b, n, truth)
    return q, ent, truth, ptr, col, lists


def brute(q, ent, kind, truth, lists):
    """The definition, one query and one entity at a time, in float64."""
    out = []
    for i in range(q.shape[0]):
        s = [float(_score(q[i].double(), ent[c].double(), kind)) for c in range(ent.shape[0])]
        t = int(truth[i])
        others = [s[c] for c in range(len(s)) if c != t and c not in set(lists[i])]
        out.append(1 + sum(x > s[t] for x in others) + sum(x == s[t] for x in others) / 2)
    return torch.tensor(out, dtype=torch.float64)


def _score(x, e, kind):
    if kind == "dot":
        return (x * e).sum()
    return -(x - e).abs().sum() if kind == "l1" else -((x - e) ** 2).sum().sqrt()


def _on(*tensors):
    return [t.to(DEVICE) for t in tensors]


@pytest.mark.parametrize("kind", KINDS)
def test_kernel_equals_reference_and_brute_force(kind):
    q, ent, truth, ptr, col, lists = _integer_case(0)
    want = brute(q, ent, kind, truth, lists)
    ref = filtered_ranks(q, ent, kind, truth, ptr, col, backend="torch")
    assert torch.equal(ref, want)
    got = filtered_ranks(*_on(q, ent), kind, *_on(truth, ptr, col), backend="triton")
    assert got.dtype == torch.float64 and torch.equal(got.cpu(), want)
    assert got[3] == 1.0                           # everything else filtered
    if kind == "dot":                              # q[6] = 0: every entity ties
        assert want[6] == 1 + (N - 1 - len(set(lists[6]) - {int(truth[6])})) / 2
    # smaller tiles: more programs on both axes and several steps over D
    bq, bn, bd = BLOCKS[kind]
    small = launch_rank_counts(*_on(q, ent, truth, ptr, col), kind, "ieee",
                               blocks=(16, 32, bd // 2))
    assert torch.equal(1 + small[:, 0].double().cpu() + small[:, 1].double().cpu() / 2, want)


@pytest.mark.parametrize("kind", KINDS)
def test_random_rows_equal_the_reference(kind):
    g = torch.Generator().manual_seed(1)
    q, ent = torch.randn(B, D, generator=g), torch.randn(N, D, generator=g)
    truth = torch.randint(0, N, (B,), generator=g)
    truth[7] = 7
    ent[100:103] = ent[7]         # exact copies of a truth row, in another column block
    ptr, col, lists = _filters(g, B, N, truth)
    want = filtered_ranks_torch(q, ent, kind, truth, ptr, col)
    got = filtered_ranks(*_on(q, ent), kind, *_on(truth, ptr, col), backend="triton").cpu()
    assert torch.equal(got, want)
    counts = launch_rank_counts(*_on(q, ent, truth, ptr, col), kind, "ieee").cpu()
    assert counts[7, 1] == 3 - len({100, 101, 102} & set(lists[7]))     # they tie exactly


#: Triton's interpreter multiplies bf16 tiles wrongly (tl.dot; loads are right): GPU only.
BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    DEVICE == "cpu", reason="bf16 tl.dot is wrong under Triton's interpreter"))


@pytest.mark.parametrize("dtype", [torch.float16, BF16])
def test_16_bit_rows(dtype):
    q, ent, truth, ptr, col, lists = _integer_case(2, dtype, b=20, n=90, d=16)
    want = brute(q, ent, "dot", truth, lists)
    assert torch.equal(filtered_ranks(q, ent, "dot", truth, ptr, col, backend="torch"), want)
    got = filtered_ranks(*_on(q, ent), "dot", *_on(truth, ptr, col), backend="triton")
    assert torch.equal(got.cpu(), want)


def test_float64_rows_take_the_reference():
    q, ent, truth, ptr, col, lists = _integer_case(2, torch.float64, b=20, n=90, d=16)
    for kind in KINDS:
        want = brute(q, ent, kind, truth, lists)
        got = filtered_ranks(*_on(q, ent), kind, *_on(truth, ptr, col))    # "auto"
        assert torch.equal(got.cpu(), want), kind
    with pytest.raises(TypeError, match="backend='triton' supports"):
        filtered_ranks(*_on(q, ent), "dot", *_on(truth, ptr, col), backend="triton")


def test_no_queries_and_no_filters():
    q, ent = torch.randn(0, 4), torch.randn(5, 4)
    none = torch.zeros(0, dtype=torch.long)
    for backend in ("torch", "triton"):
        got = filtered_ranks(*_on(q, ent), "dot", *_on(none, torch.zeros(1, dtype=torch.long),
                                                        none), backend=backend)
        assert got.shape == (0,) and got.dtype == torch.float64
    q = torch.ones(3, 4)
    ranks = filtered_ranks(*_on(q, ent.abs()), "l1", *_on(torch.tensor([0, 2, 4]),
                           torch.zeros(4, dtype=torch.long), none), backend="triton")
    assert torch.equal(ranks.cpu(), filtered_ranks(q, ent.abs(), "l1", torch.tensor([0, 2, 4]),
                                                   torch.zeros(4, dtype=torch.long), none))


def test_bad_arguments_are_named():
    q, ent = torch.randn(3, 4), torch.randn(6, 4)
    t, ptr, col = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1, 2]), torch.tensor([3, 4])
    with pytest.raises(ValueError, match="kind must be one of"):
        filtered_ranks(q, ent, "cos", t, ptr, col)
    with pytest.raises(ValueError, match="backend must be one of"):
        filtered_ranks(q, ent, "dot", t, ptr, col, backend="cuda")
    with pytest.raises(ValueError, match=r"entities must be \[N, 4\]"):
        filtered_ranks(q, ent[:, :3], "dot", t, ptr, col)
    with pytest.raises(ValueError, match="q must be 2-D"):
        filtered_ranks(q[0], ent, "dot", t, ptr, col)
    with pytest.raises(ValueError, match="truth must have 3 entries"):
        filtered_ranks(q, ent, "dot", t[:2], ptr, col)
    with pytest.raises(ValueError, match="filt_ptr must have 4 entries"):
        filtered_ranks(q, ent, "dot", t, ptr[:3], col)
    with pytest.raises(ValueError, match="filt_col must have 1 dimension"):
        filtered_ranks(q, ent, "dot", t, ptr, col[None])
    with pytest.raises(ValueError, match="entities has no rows"):
        filtered_ranks(q, ent[:0], "dot", t, ptr, col)
    with pytest.raises(ValueError, match="entities is on the meta device"):
        filtered_ranks(q, ent.to("meta"), "dot", t, ptr, col)
    with pytest.raises(ValueError, match="truth is on meta but q is on cpu"):
        filtered_ranks(q, ent, "dot", t.to("meta"), ptr, col)
    with pytest.raises(TypeError, match="entities has dtype torch.float64"):
        filtered_ranks(q, ent.double(), "dot", t, ptr, col)
    with pytest.raises(TypeError, match="q must be a floating tensor"):
        filtered_ranks(q.long(), ent, "dot", t, ptr, col)
    with pytest.raises(TypeError, match="filt_ptr must have an integer dtype"):
        filtered_ranks(q, ent, "dot", t, ptr.float(), col)


def test_debug_mode_checks_the_values(monkeypatch):
    monkeypatch.setenv("HECTOR_DEBUG", "1")
    q, ent = torch.randn(3, 4), torch.randn(6, 4)
    t, ptr, col = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1, 2]), torch.tensor([3, 4])
    with pytest.raises(ValueError, match="truth contains id 6"):
        filtered_ranks(q, ent, "dot", torch.tensor([0, 1, 6]), ptr, col)
    with pytest.raises(ValueError, match="filt_col contains a negative id"):
        filtered_ranks(q, ent, "dot", t, ptr, torch.tensor([3, -1]))
    with pytest.raises(ValueError, match="filt_ptr must rise from 0"):
        filtered_ranks(q, ent, "dot", t, torch.tensor([0, 2, 1, 2]), col)


def test_rank_counts_op_passes_opcheck():
    q, ent, truth, ptr, col, _ = _integer_case(3, b=12, n=40, d=8)
    torch.library.opcheck(rank_counts_op, (*_on(q, ent, truth, ptr, col), "l2", "ieee"),
                          test_utils=("test_schema", "test_faketensor"))


def test_scores_torch_is_the_decoders_table():
    g = torch.Generator().manual_seed(4)
    q, ent = torch.randn(5, 6, generator=g), torch.randn(7, 6, generator=g)
    dec = TransE(3, 6, p=2)
    r = torch.tensor([0, 1, 2, 0, 1])
    rows, kind = dec.ranking_rows(q, r, tails=True)
    assert kind == "l2" and torch.equal(dec.score_tails(q, r, ent), scores_torch(rows, ent, kind))


DECODERS = {"distmult": lambda: DistMult(3, 8), "transe1": lambda: TransE(3, 8, p=1),
            "transe2": lambda: TransE(3, 8, p=2), "complex": lambda: ComplEx(3, 8)}


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_link_metrics_with_the_kernel_equal_the_torch_path(name):
    torch.manual_seed(5)
    n, r = 70, 3
    known = torch.stack([torch.randint(0, n, (150,)), torch.randint(0, r, (150,)),
                         torch.randint(0, n, (150,))])
    index = KnownTriples(known, n, r)
    ent, dec = torch.randn(n, 8), DECODERS[name]()
    test = known[:, :23]
    want = link_metrics(ent, dec, test, index, batch_size=16, backend="torch")
    got = link_metrics(ent.to(DEVICE), dec.to(DEVICE), test.to(DEVICE), KnownTriples(
        known.to(DEVICE), n, r), batch_size=16, backend="triton")
    # the same ranks; the means may round differently on another device
    assert got == pytest.approx(want, rel=0, abs=1e-12)
    with pytest.raises(ValueError, match="backend must be one of"):
        link_metrics(ent, dec, test, index, backend="gpu")
