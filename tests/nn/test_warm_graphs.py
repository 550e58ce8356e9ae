"""Warm eager layer calls replayed from CUDA graphs (``hector.compiler.warm``).

On the CPU: the signature rules (which arguments a replay can stand for) and that nothing is
captured there.  On CUDA (skipped without): every layer's warm calls replay, with outputs and
every gradient equal to eager calls; a pending backward is never overwritten; a second
backward through one forward raises; new parameters, graphs and settings are new signatures;
an optimizer's in-place updates are read by the replays; and a caller's own capture and
torch.compile after warm use still work."""
import pytest
import torch

import hector
from hector.compiler import warm as _warm
from hector.compiler.warm import warm_graphs, warm_stats
from test_compile import LAYERS, assert_same, make_case

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


# -- CPU: signatures --------------------------------------------------------------------
def test_cpu_calls_are_never_captured():
    layer, args = make_case("gat")
    for _ in range(_warm.CALLS_BEFORE_CAPTURE + 2):
        layer(*args)
    assert warm_stats(layer)["captured"] == 0
    assert warm_stats(layer)["replayed"] == 0


def test_a_cpu_tensor_or_an_unknown_object_is_no_signature():
    with pytest.raises(_warm._Unfit):
        _warm._flatten((torch.zeros(2),), [], [], [])
    with pytest.raises(_warm._Unfit):
        _warm._flatten((object(),), [], [], [])
    # plain values are part of the signature as they are
    assert _warm._flatten((1, "a", None, 2.5), [], [], []) == (tuple, (1, "a", None, 2.5))


def test_warm_graphs_switch_nests_and_restores():
    assert _warm.enabled()
    with warm_graphs(False):
        assert not _warm.enabled()
        with warm_graphs(True):
            assert _warm.enabled()
        assert not _warm.enabled()
    assert _warm.enabled()


def test_settings_are_the_plain_attributes():
    layer, _ = make_case("gat")
    before = _warm._settings(layer)
    layer.negative_slope = 0.3
    assert _warm._settings(layer) != before
    assert ("training", True) in before


def test_packed_tensors_are_handed_out_fresh_with_one_copy_per_dtype(monkeypatch):
    monkeypatch.setattr(_warm, "PACK_MAX_NUMEL", 100)
    small = [torch.randn(3, 4), torch.randn(5), torch.randn(2, dtype=torch.float64),
             torch.randn(4, 2)]
    big = torch.randn(11, 10)                    # (over the limit: cloned alone)
    pack = _warm._Packed([small[0], None, big, small[1], small[2], small[3]])
    assert [len(at) for at, _, _ in pack.groups] == [3]      # the fp32 small ones
    assert pack.alone == [2, 4]          # the big one, and the only fp64 one
    got = pack.fresh()
    assert got[1] is None
    for g, want in zip([got[0], got[2], got[3], got[4], got[5]],
                       [small[0], big, small[1], small[2], small[3]]):
        assert g.shape == want.shape and g.dtype == want.dtype
        assert torch.equal(g, want) and g.data_ptr() != want.data_ptr()
    first, alone = got[0].clone(), got[2].clone()
    pack.groups[0][2].add_(1.0)          # (the next replay writes the graph's memory)
    big.add_(1.0)
    assert torch.equal(got[0], first) and torch.equal(got[2], alone)
    assert torch.equal(pack.fresh()[0], first + 1.0)


def test_copy_all_copies_every_pair():
    dst = [torch.zeros(3), torch.zeros(2, 2), torch.zeros(4)]
    src = [torch.randn(3), torch.ones(()).expand(2, 2), torch.randn(8)[::2]]
    _warm._copy_all(dst, src)
    assert all(torch.equal(d, s) for d, s in zip(dst, src))
    one = [torch.zeros(2)]
    _warm._copy_all(one, [torch.ones(2)])
    assert torch.equal(one[0], torch.ones(2))


@pytest.mark.parametrize("n", [1, 3])
def test_copy_all_records_no_autograd_on_the_slots(n):
    """A slot written from a tensor that requires grad stays outside autograd: nothing of
    the caller's graph (its leaves' gradient accumulators) lives on in the capture."""
    x = torch.randn(4, requires_grad=True)
    slots = [torch.zeros(4).detach() for _ in range(n)]
    _warm._copy_all(slots, [x * (i + 1) for i in range(n)])
    assert all(s.grad_fn is None and not s.requires_grad for s in slots)
    assert torch.equal(slots[-1], (x * n).detach())


def test_a_count_goes_on_only_for_the_same_live_objects(monkeypatch):
    """A loop that builds a new graph per call never repeats a call, even where the new
    graph sits at a freed one's address: it is not captured.  The same graph is."""
    captured = []

    class Capture:       # (what would be captured; then the call runs eagerly)
        def __init__(self, module, forward, args, kwargs, leaves, refs, params):
            captured.append(refs[0])
            raise _warm._Unfit

    def flatten(obj, leaves, refs, edges):      # (the signature names the graph by identity)
        graph = obj[0][0]
        refs.append(graph)
        edges.append(0)
        return ("g", id(graph))

    monkeypatch.setattr(_warm, "_eligible", lambda: True)
    monkeypatch.setattr(_warm, "_Captured", Capture)
    monkeypatch.setattr(_warm, "_flatten", flatten)

    class Graph:
        pass
    layer = torch.nn.Linear(2, 2)
    ids = []
    for _ in range(2 * _warm.CALLS_BEFORE_CAPTURE + 2):
        g = Graph()
        ids.append(id(g))
        _warm.warm_call(layer, lambda m, g: None, (g,), {})
        del g
    assert len(set(ids)) < len(ids)           # (addresses did come back)
    assert captured == []
    g = Graph()
    for _ in range(_warm.CALLS_BEFORE_CAPTURE + 1):
        _warm.warm_call(layer, lambda m, g: None, (g,), {})
    assert captured == [g]


# -- CUDA: replays ----------------------------------------------------------------------
def _case(name):
    layer, args = make_case(name, backend="triton")
    return layer.train(), args


def _features(args):
    return args[0] if isinstance(args[0], dict) else {"x": args[0]}


def _call(layer, args, feats):
    call = (feats if isinstance(args[0], dict) else feats["x"],) + tuple(args[1:])
    return layer(*call)


def _step(layer, args, seed=0):
    """(output, gradients by name) of one forward and weighted-sum backward on fresh
    feature tensors (``seed``), the layer's gradients cleared first."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    feats = {k: torch.randn(v.shape, generator=gen, device="cuda").requires_grad_()
             for k, v in _features(args).items()}
    layer.zero_grad(set_to_none=True)
    out = _call(layer, args, feats)
    flat = torch.cat([o.flatten() for o in out.values()]) if isinstance(out, dict) \
        else out.flatten()
    (flat * torch.linspace(-1, 1, flat.numel(), device="cuda")).sum().backward()
    grads = {f"feature {k}": v.grad for k, v in feats.items()}
    grads.update({n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None})
    return flat.detach(), grads


@cuda
@pytest.mark.parametrize("name", LAYERS)
def test_warm_training_steps_replay_and_equal_eager(name):
    layer, args = _case(name)
    with warm_graphs(False):
        want = [_step(layer, args, seed) for seed in range(4)]
    got = [_step(layer, args, seed) for seed in range(4)]
    stats = warm_stats(layer)
    assert stats["captured"] == 1 and stats["replayed"] == 4 - _warm.CALLS_BEFORE_CAPTURE
    assert stats["failed"] == 0
    for g, w in zip(got, want):
        assert_same(g, w)


@cuda
@pytest.mark.parametrize("name", LAYERS)
def test_warm_inference_replays_and_equals_eager(name):
    layer, args = _case(name)
    layer.eval()
    with torch.no_grad():
        with warm_graphs(False):
            want = _call(layer, args, _features(args))
        outs = [_call(layer, args, _features(args)) for _ in range(4)]
    assert warm_stats(layer)["replayed"] == 4 - _warm.CALLS_BEFORE_CAPTURE
    for out in outs:
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert outs[-1] is not outs[-2]          # fresh tensors, not the graph's own memory
    if isinstance(outs[-1], torch.Tensor):
        assert outs[-1].data_ptr() != outs[-2].data_ptr()


@cuda
def test_a_second_forward_before_the_backward_runs_eagerly():
    layer, args = _case("gat")
    for seed in range(3):
        _step(layer, args, seed)                     # captured by now
    feats = [{k: torch.randn_like(v).requires_grad_() for k, v in _features(args).items()}
             for _ in range(2)]
    with warm_graphs(False):
        want = [torch.autograd.grad(_call(layer, args, f).square().sum(), f["x"])[0]
                for f in feats]
    before = warm_stats(layer)
    outs = [_call(layer, args, f) for f in feats]    # the second may not overwrite the first
    after = warm_stats(layer)
    assert after["replayed"] == before["replayed"] + 1 and after["eager"] == before["eager"] + 1
    got = [torch.autograd.grad(o.square().sum(), f["x"])[0] for o, f in zip(outs, feats)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@cuda
def test_a_second_backward_through_one_replay_raises():
    layer, args = _case("gat")
    for seed in range(3):
        _step(layer, args, seed)
    x = torch.randn_like(args[0]).requires_grad_()
    out = layer(x, args[1]).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        out.backward()


@cuda
def test_optimizer_updates_are_read_and_new_parameters_recapture():
    layer, args = _case("rgat")
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    for seed in range(4):                            # in-place updates between replays
        _step(layer, args, seed)
        opt.step()
    with warm_graphs(False):
        want = _step(layer, args, 9)
    assert_same(_step(layer, args, 9), want)
    assert warm_stats(layer)["captured"] == 1
    name, p = next(iter(layer.named_parameters()))
    *path, attr = name.split(".")
    owner = layer
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, attr, torch.nn.Parameter(torch.randn_like(p)))   # another tensor
    with warm_graphs(False):
        want = _step(layer, args, 3)
    for _ in range(3):
        got = _step(layer, args, 3)
    assert_same(got, want)
    assert warm_stats(layer)["captured"] == 2


@cuda
def test_another_graph_or_setting_is_another_signature():
    layer, args = _case("gat")
    for seed in range(3):
        _step(layer, args, seed)
    other = hector.Graph(args[1].input_edge_index().flip(0), num_nodes=args[1].num_nodes)
    with warm_graphs(False):
        want = _step(layer, (args[0], other), 1)
    assert_same(_step(layer, (args[0], other), 1), want)
    layer.negative_slope = 0.5
    with warm_graphs(False):
        want = _step(layer, args, 2)
    assert_same(_step(layer, args, 2), want)


@cuda
@pytest.mark.parametrize("name", LAYERS)
def test_a_callers_capture_after_warm_use_matches_eager(name):
    from test_cuda_graphs import captured_step
    layer, args = _case(name)
    for seed in range(4):
        _step(layer, args, seed)                     # warm calls replayed
    layer.zero_grad(set_to_none=True)
    graph, flat, static = captured_step(layer, args)
    with warm_graphs(False):
        out = _call(layer, args, static)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(flat, torch.cat([o.flatten() for o in out.values()])
                               if isinstance(out, dict) else out.flatten())


@cuda
def test_an_unchanged_input_is_not_copied_again_but_a_changed_one_is():
    layer, args = _case("transformer")
    layer.eval()
    x = args[0].clone()
    with torch.no_grad():
        for _ in range(4):
            layer(x, args[1])
        cap = next(v for v in layer.__dict__["_hector_warm"].seen.values()
                   if isinstance(v, _warm._Captured))
        assert cap.sources[0][0]() is x
        x.mul_(-2.0)                                  # in place: a new version
        got = layer(x, args[1])
        with warm_graphs(False):
            want = layer(x, args[1])
    torch.testing.assert_close(got, want)


def test_saved_tensor_hooks_turn_replays_off():
    """Checkpointing and save_on_cpu decide where saved values live: no replay under them."""
    assert not _warm._saved_hooks()
    with torch.autograd.graph.save_on_cpu():
        assert _warm._saved_hooks()
    assert not _warm._saved_hooks()


def test_a_layers_table_survives_other_modules_but_not_its_own_new_parameters():
    layer, _ = make_case("gat")
    table = _warm._table(layer)
    table.seen["key"] = 1
    torch.nn.Linear(2, 2)                      # another module registers parameters
    assert _warm._table(layer) is table and table.seen["key"] == 1
    layer.att_src = torch.nn.Parameter(torch.zeros_like(layer.att_src))   # its own: new table
    fresh = _warm._table(layer)
    assert fresh is not table and not fresh.seen
    assert any(p is layer.att_src for p in fresh.params)


@cuda
@pytest.mark.parametrize("name", LAYERS)
def test_a_warm_step_runs_no_hector_code_but_the_replay_and_reads_nothing(name):
    """Counted: once warm, a training step enters no hector function outside the replay
    machinery (no planning, no checks, no launch set-up) and reads nothing back to the host."""
    import sys
    from helpers import HECTOR_SRC, host_reads
    layer, args = _case(name)
    for seed in range(4):
        _step(layer, args, seed)
    entered = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(HECTOR_SRC):
            entered.add(frame.f_code.co_filename)
    with host_reads() as reads:
        sys.setprofile(profile)
        try:
            _step(layer, args, 5)
        finally:
            sys.setprofile(None)
    assert warm_stats(layer)["replayed"] == 3
    assert {f.replace(HECTOR_SRC, "") for f in entered} <= {"/compiler/warm.py", "/checks.py",
                                                           "/kernels/eager.py"}
    assert not reads


def _mean_of_neighbours(m, in_dim, out_dim):
    x = m.node_input("x", in_dim)
    W = m.weight("weight", (in_dim, out_dim), per="relation")
    return m.aggregate(m.linear(m.src(x), W), "mean", per_relation=True)


@cuda
def test_a_compiled_dsl_module_replays_too():
    """``hector.compile`` modules go through the same warm calls as hector.nn's layers."""
    from helpers import random_relational
    ei, et = random_relational()
    graph = hector.Graph(ei, et, num_nodes=24, num_relations=4).to("cuda")
    layer = hector.compile(_mean_of_neighbours, in_dim=16, out_dim=8, num_relations=4).cuda()

    def step(seed):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(24, 16, generator=gen, device="cuda").requires_grad_()
        layer.zero_grad(set_to_none=True)
        out = layer(graph, x=x)
        (out * torch.linspace(-1, 1, out.numel(), device="cuda").view_as(out)).sum().backward()
        return out.detach(), {"x": x.grad, "weight": layer.weight.grad.clone()}
    with warm_graphs(False):
        want = [step(s) for s in range(4)]
    got = [step(s) for s in range(4)]
    assert warm_stats(layer)["replayed"] == 4 - _warm.CALLS_BEFORE_CAPTURE
    for g, w in zip(got, want):
        assert_same(g, w)


def test_only_overlapping_inputs_count_as_aliased():
    """A replay copies each input into a buffer of its own: inputs that share elements would
    stop sharing them, so such a call runs eagerly; disjoint views of one tensor (HGT's
    per-type pieces of one split feature tensor) are separate inputs and may replay."""
    x = torch.randn(10, 4)
    a, b, c = torch.split(x, [3, 3, 4])
    assert not _warm.overlapping([a, b, c])
    assert not _warm.overlapping([x[:, :2], torch.randn(3)])
    assert _warm.overlapping([x, a])
    assert _warm.overlapping([x[2:5], x[4:6]])
    assert _warm.overlapping([x.t(), x[9:]])                 # a transpose spans every row
    assert not _warm.overlapping([x[:5], x[5:].t()])
    assert not _warm.overlapping([x[:0], x[:0]])             # empty views share nothing



def test_a_captured_signature_checks_aliasing_again_only_at_new_addresses(monkeypatch):
    """The signature fixes each input's extent, so one set of addresses found disjoint stays
    disjoint; inputs at other addresses are checked again (and run eagerly if they alias)."""
    entry = object.__new__(_warm._Captured)
    entry.disjoint_at = None
    x = torch.randn(10, 3)
    assert _warm._disjoint(entry, [x[:5], x[5:]])
    assert not _warm._disjoint(entry, [x[:5], x[4:9]])       # new addresses, aliased
    calls = []
    monkeypatch.setattr(_warm, "overlapping", lambda ts: calls.append(ts) or False)
    assert _warm._disjoint(entry, [x[:5], x[5:]])
    assert calls == []                                       # (the same addresses: no check)
    assert _warm._disjoint(None, [x[:5], x[5:]]) and len(calls) == 1   # uncaptured: checked


def test_named_tuples_and_dict_subclasses_are_signatures_like_their_bases():
    from collections import OrderedDict, namedtuple
    pair = namedtuple("pair", "a b")
    assert _warm._flatten(pair(1, 2.5), [], [], []) == (pair, (1, 2.5))
    assert (_warm._flatten(OrderedDict(a=1), [], [], [])
            == _warm._flatten({"a": 1}, [], [], []))
    with pytest.raises(_warm._Unfit):
        _warm._flatten(pair(torch.zeros(1), 1), [], [], [])     # (a CPU tensor inside)

@cuda
def test_hgt_on_split_features_replays():
    """HGT called with one feature tensor split per node type (as hector bench and a
    stacked model do): warm calls replay and equal eager ones."""
    layer, (xs, eid) = make_case("hgt", backend="triton")
    layer.train()
    order = list(xs)
    whole = torch.cat([xs[t] for t in order]).cuda()

    def step():
        x = whole.clone().requires_grad_()
        parts = dict(zip(order, torch.split(x, [xs[t].shape[0] for t in order])))
        layer.zero_grad(set_to_none=True)
        out = layer(parts, eid)
        sum(o.square().sum() for o in out.values()).backward()
        return [o.detach() for o in out.values()], x.grad
    with warm_graphs(False):
        want = step()
    got = [step() for _ in range(4)][-1]
    assert warm_stats(layer)["replayed"] == 4 - _warm.CALLS_BEFORE_CAPTURE
    for g, w in zip(got[0] + [got[1]], want[0] + [want[1]]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@cuda
def test_a_replayed_layers_several_outputs_can_be_modified_in_place():
    """HGT returns one output per node type: a training replay hands them out as tensors of
    their own (views of one buffer made inside the replay's autograd.Function could not be
    modified in place), and an in-place activation on them back-propagates as eagerly."""
    layer, (xs, eid) = make_case("hgt", backend="triton")
    layer.train()

    def step():
        x = {t: v.clone().requires_grad_() for t, v in xs.items()}
        layer.zero_grad(set_to_none=True)
        out = layer(x, eid)
        sum(o.relu_().sum() for o in out.values()).backward()
        return [o.detach() for o in out.values()], [x[t].grad for t in xs]
    with warm_graphs(False):
        want = step()
    got = [step() for _ in range(4)][-1]
    assert warm_stats(layer)["replayed"] >= 1
    for g, w in zip(got[0] + got[1], want[0] + want[1]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


class _FailsUnderCapture(torch.nn.Module):
    """A layer whose forward reads the device only while a capture records it: its eager
    calls work, its capture fails part-way (the read is not allowed there)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4, device="cuda"))

    @_warm.graphed
    def forward(self, x):
        if torch.cuda.is_current_stream_capturing():
            x.sum().item()
        return x * self.w


@cuda
@pytest.mark.parametrize("grad", [True, False])
def test_a_failed_capture_leaves_the_stream_and_random_numbers_working(grad):
    layer = _FailsUnderCapture()
    stream = torch.cuda.current_stream()
    x = torch.randn(3, 4, device="cuda")
    with torch.set_grad_enabled(grad), pytest.warns(RuntimeWarning, match="could not be captured"):
        outs = [layer(x) for _ in range(_warm.CALLS_BEFORE_CAPTURE + 5)]
    assert warm_stats(layer)["failed"] == 1 and warm_stats(layer)["replayed"] == 0  # (once)
    assert torch.cuda.current_stream() == stream
    for out in outs:
        torch.testing.assert_close(out, x)
    # the generator left capture mode: random ops outside a capture work and stay seeded
    torch.manual_seed(3)
    a = torch.nn.functional.dropout(torch.ones(64, device="cuda"), 0.5)
    torch.manual_seed(3)
    assert torch.equal(a, torch.nn.functional.dropout(torch.ones(64, device="cuda"), 0.5))
