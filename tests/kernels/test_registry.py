"""hector.kernels.registry: deterministic rendering, the spec hash, the on-disk kernel cache
(hits, corrupt files, an unwritable folder) and parameter checks.  Every test points
``HECTOR_CACHE_DIR`` at its own ``tmp_path`` (the ``cache`` fixture, conftest.py)."""
import os

import pytest
import torch

from hector.kernels import registry

GEMM = dict(has_gather=True, has_scatter=False, dot_fp32=False, input_precision="ieee",
            accumulate=False, has_bias=False, narrow=False, prologue="",
            has_csr=False, has_addend=False, has_csr_out=False, extra_cols=0)
WGRAD = {k: v for k, v in GEMM.items()
         if k not in ("accumulate", "has_bias", "has_addend", "has_csr_out", "extra_cols")}
SCORE = dict(has_qk=True, has_src=False, has_dst=True, has_leaky=True, has_dropout=False,
             edge_parallel=False, has_bias=False, dst_edge=False, shared_kv=False,
             normed_k=False, merge_last=False)
TRITON_OK = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_triton = pytest.mark.skipif(not TRITON_OK, reason="no CUDA and TRITON_INTERPRET unset")


def all_params(name):
    """Every registry kernel's first parameter combination (allowed[0] of each)."""
    return {k: allowed[0] for k, allowed in registry.entry(name).params.items()}


def test_every_kernel_renders_valid_python_deterministically(cache):
    hashes = {}
    for name in registry.KERNELS:
        params = all_params(name)
        text = registry.source(name, **params)
        compile(text, name, "exec")   # syntax only: no triton import needed
        assert registry.entry(name).function in text
        digest = registry.spec_hash(name, **params)
        registry.clear_memo()          # recomputed from the template texts, not memoised
        assert registry.source(name, **params) == text
        assert registry.spec_hash(name, **params) == digest
        hashes[name] = digest
    # The kernel name is hashed: kernels sharing a template still get files of their own.
    assert len(set(hashes.values())) == len(hashes)


def test_params_are_rendered_in_not_constexpr_flags(cache):
    plain = registry.source("segment_mm", **GEMM)
    scattered = registry.source("segment_mm", **dict(GEMM, has_scatter=True, accumulate=True))
    assert "tl.atomic_add" in scattered and "tl.atomic_add" not in plain
    # a permutation: stored through the index, no atomics
    permuted = registry.source("segment_mm", **dict(GEMM, has_scatter=True))
    assert "tl.atomic_add" not in permuted and "tl.load(scatter + offs_m" in permuted
    biased = registry.source("segment_mm", **dict(GEMM, has_bias=True))
    assert "tl.load(bias + seg" in biased and "tl.load(bias" not in plain
    added = registry.source("segment_mm", **dict(GEMM, has_addend=True))
    assert "tl.load(addend + dst" in added and "tl.load(addend" not in plain
    assert "HAS_GATHER" not in plain and "tl.load(gather + offs_m" in plain
    # a narrow product multiplies by broadcasting (reduced over the last axis: the spelling
    # Triton would turn into a TF32 tl.dot is not used)
    narrow = registry.source("segment_mm", **dict(GEMM, narrow=True))
    assert "tl.dot(" in plain and "tl.dot(" not in narrow and "axis=2)" in narrow
    # an input function: applied to the loaded tile, in both GEMM kernels
    for name, params in (("segment_mm", GEMM), ("segment_mm_wgrad", dict(WGRAD, atomic=False,
                                                                           has_sums=False))):
        gelu = registry.source(name, **dict(params, prologue="gelu"))
        assert "_prologue(" in gelu and "tl.erf" in gelu
        assert "_prologue(" not in registry.source(name, **params)
    edge = registry.source("attention_fwd", **dict(SCORE, edge_parallel=True))
    assert "m_part + own_slot" in edge and "m_part + own_slot" not in registry.source(
        "attention_fwd", **SCORE)
    # cut rows merged by their last chunk (an arrival counter) only where asked
    merged = registry.source("attention_fwd", **dict(SCORE, edge_parallel=True, merge_last=True))
    assert "tl.atomic_add(counter, 1" in merged and "atomic_add(counter" not in edge
    # a destination term per edge: read through dst_index, not once per row
    per_edge = registry.source("attention_fwd", **dict(SCORE, dst_edge=True))
    assert "tl.load(dst_index + eids" in per_edge and "s_dst = tl.load" not in per_edge
    assert "dst_index + eids" not in registry.source("attention_fwd", **SCORE)
    bwd = dict(SCORE, need_dq=True, need_ddst=True)
    del bwd["has_bias"]
    assert "tl.atomic_add(da_dst" in registry.source("attention_bwd_dst", **dict(bwd, dst_edge=True))
    assert "tl.atomic_add" not in registry.source("attention_bwd_dst", **bwd)
    # k and v shared by the heads: their reads index the same columns for every head
    shared = registry.source("attention_fwd", **dict(SCORE, shared_kv=True))
    assert "inner_ks = offs_h[:, None] * 0 + offs_dk[None, :]" in shared
    assert "inner_ks = inner_k" in registry.source("attention_fwd", **SCORE)
    # keys formed from the gathered value rows (AGNN's k = x / |x|): one gather per edge
    normed = registry.source("attention_fwd", **dict(SCORE, normed_k=True))
    plain = registry.source("attention_fwd", **SCORE)
    assert normed.count("gather_rows(") == plain.count("gather_rows(") - 1
    assert "v_t / tl.load(k_norm + u" in normed and "k_norm +" not in plain


def test_different_params_give_different_hashes_and_files(cache):
    seen = {}
    for name, params in [("segment_mm", GEMM), ("segment_mm", dict(GEMM, has_gather=False)),
                         ("segment_mm", dict(GEMM, input_precision="tf32")),
                         ("segment_mm", dict(GEMM, prologue="gelu")),
                         ("segment_mm_wgrad", dict(WGRAD, atomic=True, has_sums=False)),
                         ("segment_mm_wgrad", dict(WGRAD, atomic=True, has_sums=True)),
                         ("attention_fwd", SCORE), ("attention_fwd", dict(SCORE, has_src=True))]:
        digest = registry.spec_hash(name, **params)
        assert digest not in seen, (name, params, seen.get(digest))
        seen[digest] = (name, params)
        assert registry.cache_path(name, **params) == cache / f"{digest}.py"
    # The versions are part of the key: another Triton gets another file.
    before = registry.spec_hash("segment_mm", **GEMM)
    registry.clear_memo()
    real = registry._versions
    try:
        registry._versions = lambda: (real()[0], "0.0-other")
        assert registry.spec_hash("segment_mm", **GEMM) != before
    finally:
        registry._versions = real
        registry.clear_memo()


def test_unknown_kernel_and_bad_parameters_are_named(cache):
    with pytest.raises(ValueError, match="unknown kernel name 'segment_gemm'.*segment_mm"):
        registry.source("segment_gemm")
    with pytest.raises(ValueError, match="'nope'"):
        registry.kernel("nope")
    with pytest.raises(TypeError, match="no parameter 'has_skew'"):
        registry.source("segment_mm", has_skew=True, **GEMM)
    with pytest.raises(TypeError, match="needs parameter 'has_scatter'"):
        registry.source("segment_mm", has_gather=True, dot_fp32=False, input_precision="ieee",
                        accumulate=False, has_bias=False, has_csr=False, has_addend=False,
                        has_csr_out=False, extra_cols=0)
    with pytest.raises(ValueError, match="'input_precision' must be one of"):
        registry.source("segment_mm", **dict(GEMM, input_precision="bf16x9"))
    with pytest.raises(ValueError, match="'has_gather' must be one of"):
        registry.source("segment_mm", **dict(GEMM, has_gather=1))


def test_cache_hit_neither_renders_nor_writes(cache):
    path = registry.materialise("attention_combine", has_bias=False)
    stamp = path.stat().st_mtime_ns
    text = path.read_text()
    registry.clear_memo()
    renders, writes = registry.stats["renders"], registry.stats["writes"]
    assert registry.materialise("attention_combine", has_bias=False) == path
    assert (registry.stats["renders"], registry.stats["writes"]) == (renders, writes)
    assert path.stat().st_mtime_ns == stamp and path.read_text() == text
    assert [p.name for p in cache.iterdir()] == [path.name]   # no temp file left behind


@pytest.mark.parametrize("damage", ["truncated", "broken body"])
def test_corrupt_cache_file_is_regenerated(cache, damage):
    path = registry.materialise("row_dot", has_bias=False)
    good = path.read_text()
    if damage == "truncated":          # a partial write: the trailer line is missing
        path.write_text(good[: len(good) // 2])
    else:                              # the trailer survived but the code did not
        path.write_text("def row_dot_kernel(:\n" + good.splitlines(keepends=True)[-1])
    registry.clear_memo()
    if damage == "truncated":
        assert registry.materialise("row_dot", has_bias=False) == path and path.read_text() == good
    if TRITON_OK:
        fn = registry.kernel("row_dot", has_bias=False)
        assert fn.fn.__name__ == "row_dot_kernel" and path.read_text() == good


def test_unwritable_cache_dir_falls_back_to_a_temp_dir(tmp_path, monkeypatch, cache):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HECTOR_CACHE_DIR", str(blocker / "kernels"))
    registry.clear_memo()
    with pytest.warns(RuntimeWarning, match="kernel cache .* is unusable"):
        path = registry.materialise("combine_sum")
    assert path.exists() and blocker not in path.parents and path.parent != cache
    assert registry.materialise("combine_sum") == path   # same fallback, one warning


@needs_triton
def test_kernel_loads_from_cache_file_and_runs(cache):
    fn = registry.kernel("row_dot", has_bias=False)
    assert registry.kernel("row_dot", has_bias=False) is fn      # memoised in-process
    assert fn.fn.__code__.co_filename == str(registry.cache_path("row_dot", has_bias=False))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = torch.randn(5, 7, device=device), torch.randn(5, 7, device=device)
    out = torch.empty(5, device=device)
    fn[(1,)](a, b, out, out, 5, 7, 1, 0, BLOCK_R=8, BLOCK_D=8)    # (no bias: any pointer)
    torch.testing.assert_close(out, (a * b).sum(1))
