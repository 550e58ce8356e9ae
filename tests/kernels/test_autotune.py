"""hector.kernels.autotune with an injected timer: the fastest config wins, the choice is
saved to autotune.json and reloaded without timing, the interpreter and HECTOR_AUTOTUNE=0
skip timing, and a forced tuning run of the real kernels (atomics included) still gives the
right answer."""
import json
import os

import pytest
import torch

from hector.kernels import autotune, registry
from hector.kernels.segment_mm.spec import GemmSchedule

TRITON_OK = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_triton = pytest.mark.skipif(not TRITON_OK, reason="no CUDA and TRITON_INTERPRET unset")

CUDA = torch.device("cuda")
CONFIGS = tuple(GemmSchedule(block_m=m, num_warps=w) for m, w in ((64, 4), (128, 8), (32, 2)))
MS = {64: 3.0, 128: 1.0, 32: 2.0}   # block_m -> fake milliseconds: config 1 is fastest


def fake_timer(calls):
    def timer(fn):
        fn()
        return MS[calls[-1].block_m]
    return timer


def test_fastest_config_is_picked_saved_and_reloaded(cache):
    calls = []
    pick = autotune.choose("segment_mm", "ab" * 32, (1024, 32), CONFIGS, calls.append, CUDA,
                           timer=fake_timer(calls), tune=True)
    assert pick == CONFIGS[1] and calls == list(CONFIGS)
    saved = json.loads((cache / autotune.FILE_NAME).read_text())
    (key, record), = saved.items()
    assert key.startswith("segment_mm/" + "ab" * 12 + "/1024x32/")
    assert record["index"] == 1 and record["ms"] == [3.0, 1.0, 2.0]
    assert record["config"]["block_m"] == 128

    def no_timing(fn):
        raise AssertionError("a saved choice must not be timed again")
    # In memory, then (memo cleared: another process) from the JSON file.
    for clear in (False, True):
        if clear:
            autotune.clear_memo()
        assert autotune.choose("segment_mm", "ab" * 32, (1024, 32), CONFIGS, calls.append,
                               CUDA, timer=no_timing, tune=True) == CONFIGS[1]
    assert len(calls) == 3
    # Another bucket, or another config list, is tuned afresh.
    autotune.choose("segment_mm", "ab" * 32, (2048, 32), CONFIGS, calls.append, CUDA,
                    timer=fake_timer(calls), tune=True)
    assert len(calls) == 6 and len(json.loads((cache / autotune.FILE_NAME).read_text())) == 2
    assert autotune.recorded("ab" * 32).keys() == json.loads(
        (cache / autotune.FILE_NAME).read_text()).keys()


def test_stale_or_corrupt_records_are_retuned(cache):
    cache.mkdir(parents=True)
    (cache / autotune.FILE_NAME).write_text("{not json")
    calls = []
    assert autotune.choose("k", "cd" * 32, (8,), CONFIGS, calls.append, CUDA,
                           timer=fake_timer(calls), tune=True) == CONFIGS[1]
    data = json.loads((cache / autotune.FILE_NAME).read_text())
    (key, record), = data.items()
    record["config"]["block_m"] = 999   # no longer the config at that index
    (cache / autotune.FILE_NAME).write_text(json.dumps(data))
    autotune.clear_memo()
    autotune.choose("k", "cd" * 32, (8,), CONFIGS, calls.append, CUDA,
                    timer=fake_timer(calls), tune=True)
    assert len(calls) == 6


def test_failing_configs_are_skipped(cache):
    def run(cfg):
        if cfg.block_m == 128:
            raise RuntimeError("out of shared memory")
    calls = []

    def timer(fn):
        fn()
        calls.append(1)
        return 5.0 - len(calls)
    assert autotune.choose("k", "ef" * 32, (8,), CONFIGS, run, CUDA, timer=timer,
                           tune=True) == CONFIGS[2]


def test_untimed_under_interpreter_cpu_or_switched_off(cache, monkeypatch):
    def no_timing(fn):
        raise AssertionError("must not time")
    assert autotune.choose("k", "00" * 32, (8,), CONFIGS, lambda c: None, torch.device("cpu"),
                           timer=no_timing) == CONFIGS[0]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not autotune.enabled(CUDA)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("HECTOR_AUTOTUNE", "0")
    assert not autotune.enabled(CUDA)
    assert autotune.choose("k", "00" * 32, (8,), CONFIGS, lambda c: None, CUDA,
                           timer=no_timing) == CONFIGS[0]
    monkeypatch.setenv("HECTOR_AUTOTUNE", "1")
    assert autotune.enabled(CUDA) and not autotune.enabled(torch.device("cpu"))
    assert not (cache / autotune.FILE_NAME).exists()


def test_bucket_rounds_up_to_powers_of_two():
    assert autotune.bucket(0, 1, 3, 64, 65) == (1, 1, 4, 64, 128)


@pytest.fixture
def forced_tuning(cache, monkeypatch):
    """Tuning switched on whatever the device, with a timer that runs each trial once and
    ranks configs by their order reversed (so the last config, not the default, wins)."""
    order = []

    def timer(fn):
        fn()
        order.append(1)
        return 10.0 - len(order)
    monkeypatch.setattr(autotune, "enabled", lambda device: True)
    monkeypatch.setattr(autotune, "_timer", timer)
    return order


@needs_triton
def test_tuned_segment_mm_with_atomics_stays_exact(forced_tuning):
    """Each trial of a scattering GEMM adds into its output with atomics: trials must not add
    into one another's output (they would double the result)."""
    from hector.kernels.segment_mm.op import segment_mm
    gen = torch.Generator().manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(9, 16, generator=gen).to(device).requires_grad_()
    w = torch.randn(2, 16, 16, generator=gen).to(device).requires_grad_()
    seg = torch.tensor([0, 5, 12], device=device)
    gather = torch.randint(0, 9, (12,), generator=gen).to(device)
    scatter = torch.randint(0, 4, (12,), generator=gen).to(device)
    outs = []
    for backend in ("triton", "torch"):
        out = segment_mm(x, w, seg, gather=gather, scatter=scatter, num_out_rows=4,
                         backend=backend)
        outs.append((out, *torch.autograd.grad(out.square().sum(), (x, w))))
    assert len(forced_tuning) >= 2   # the forward (and dx) were really tuned
    for got, want in zip(*outs):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    saved = json.loads((registry.cache_dir() / autotune.FILE_NAME).read_text())
    assert any(k.startswith("segment_mm/") for k in saved)


@needs_triton
def test_tuned_edge_attention_stays_exact(forced_tuning):
    from hector import Graph
    from hector.kernels.attention.op import edge_attention
    gen = torch.Generator().manual_seed(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ei = torch.randint(0, 12, (2, 40), generator=gen)
    g = Graph(ei, num_nodes=12).to(device)
    v = torch.randn(12, 2, 4, generator=gen).to(device).requires_grad_()
    a_src = torch.randn(12, 2, generator=gen).to(device).requires_grad_()
    a_dst = torch.randn(12, 2, generator=gen).to(device).requires_grad_()
    outs = []
    for backend in ("triton", "torch"):
        out = edge_attention(g, v, a_src=a_src, a_dst=a_dst, negative_slope=0.2,
                             backend=backend)
        outs.append((out, *torch.autograd.grad(out.square().sum(), (v, a_src, a_dst))))
    assert len(forced_tuning) >= 3
    for got, want in zip(*outs):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    saved = json.loads((registry.cache_dir() / autotune.FILE_NAME).read_text())
    assert {k.split("/")[0] for k in saved} >= {"attention_fwd", "attention_bwd_src"}


@needs_triton
def test_tuned_attention_destination_term_per_edge_stays_exact(forced_tuning):
    """RGAT's destination term is per (dst, relation) row and its gradient is summed into
    those rows with atomics: every autotune trial must start from zeros (they summed into
    one another's: the GPU's first RGAT backward per shape had d a_dst several times over)."""
    from hector import Graph
    from hector.kernels.attention.custom_ops import (edge_attention_grads_triton,
                                                     edge_attention_triton)
    from hector.kernels.attention.plan import AttentionPlan, make_plan
    from hector.kernels.attention.spec import AttentionSpec
    gen = torch.Generator().manual_seed(2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n, e, heads, groups = 12, 40, 2, 7
    g = Graph(torch.randint(0, n, (2, e), generator=gen), num_nodes=n).to(device)
    t = {r: torch.randn(*s, generator=gen).to(device) for r, s in
         dict(v=(n, heads, 3), a_src=(n, heads), a_dst=(groups, heads)).items()}
    dst_index = torch.randint(0, groups, (e,), generator=gen).to(device)
    dout = torch.randn(n, heads, 3, generator=gen).to(device)
    spec = AttentionSpec.of(t["v"], None, t["a_src"], t["a_dst"], 0.2, dst_index=dst_index)
    tuned = make_plan(g, spec, "node")
    results = []
    for plan in (tuned, AttentionPlan(tuned.dst, tuned.src)):     # tuned, then pinned
        out, lse = edge_attention_triton(g, t["v"], None, None, t["a_src"], t["a_dst"],
                                         scale=1.0, negative_slope=0.2, spec=spec, plan=plan,
                                         return_lse=True, dst_index=dst_index)
        results.append(edge_attention_grads_triton(
            g, spec, plan, [True, False, False, True, True], dout, t["v"], None, None,
            t["a_src"], t["a_dst"], out, lse, 1.0, 0.2, dst_index=dst_index))
    assert len(forced_tuning) >= 3   # the destination-side backward was really tuned
    for name, got, want in zip(("dv", "dq", "dk", "da_src", "da_dst"), *results):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
