"""Compile the segment GEMM's CSR kernels and the attention forward for an sm_90 target
without a GPU, with whatever Triton is installed (the device machines run Triton 3.6; this
machine's wheel may differ).

    python scripts/triton_compile_check.py render DIR      # with hector's environment
    python scripts/triton_compile_check.py compile DIR     # with the Triton to check, e.g.
        python -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0
        /tmp/t36/bin/python scripts/triton_compile_check.py compile DIR

``render`` writes the kernel sources hector renders for the CSR prologue, the CSR scatter
epilogue and the CSR weight gradient (fp32 and bf16, K = N = 64), the attention traversal kernels
(forward node- and edge-parallel, with and without the in-traversal merge of cut rows
``merge_last``, both backward sides with and without it; GAT's, AGNN's normalised-key and Transformer's terms;
fp32 and bf16) and a manifest; ``compile``
runs each through ``triton.compile`` (every pass up to PTX and ptxas, no driver needed)
for several row tiles and warp counts and prints OK or the first error line.  How Triton
3.6's "'tt.load' op failed to verify that mask type matches ptr type" in the CSR walks was
found and checked (docs/perf-notes.md, "Segment GEMM").
"""
import importlib.util
import itertools
import json
import sys
from pathlib import Path

_GEMM_PTRS = ("tiles", "x", "gather", "w", "bias", "scatter", "out", "csr_ptr", "csr_col",
              "csr_val", "addend")
_GEMM_INTS = ("K", "N", "stride_xm", "stride_xk", "stride_ws", "stride_wk", "stride_wn",
              "stride_bs", "stride_om", "stride_on", "stride_am", "stride_an")
_WGRAD_PTRS = ("tiles", "x", "gather", "dy", "scatter", "dw", "db", "csr_ptr", "csr_col",
               "csr_val")
#: The attention traversal kernels' arguments, by name (templates/attention_*.py.j2): index
#: pointers, fp32 buffers (log-sum-exps, partials, norms, per-edge term gradients), scalars;
#: every other pointer holds the layer's dtype, every other argument is an int.
_ATTN_INT_PTRS = ("ptr", "col", "eid", "chunk_rows", "row_ids", "dst_index", "counts")
_ATTN_FP32_PTRS = ("k_norm", "lse", "delta", "m_part", "l_part", "acc_part", "dq_part",
                   "dd_part", "dk_part", "dv_part", "ds_part", "da_dst", "da_src")
_ATTN_SCALARS = dict(scale="fp32", slope="fp32", seed="*i64", drop_threshold="i32",
                     drop_scale="fp32")
_ATTN_DATA_PTRS = ("q", "k", "v", "a_src", "a_dst", "bias", "out", "dout", "dq", "dk", "dv")
#: (kernel, strategy, extra render parameters) compiled for each term set and dtype.
_ATTN_KERNELS = (("attention_fwd", "node", dict(has_bias=True, merge_last=False)),
                 ("attention_fwd", "edge", dict(has_bias=True, merge_last=False)),
                 ("attention_fwd", "edge", dict(has_bias=True, merge_last=True)),
                 ("attention_bwd_dst", "edge", dict(merge_last=False)),
                 ("attention_bwd_dst", "edge", dict(merge_last=True)),
                 ("attention_bwd_src", "edge", dict(merge_last=False)),
                 ("attention_bwd_src", "edge", dict(merge_last=True)))


def _attention_specs(dtype) -> dict:
    """GAT's terms (source and destination scores), AGNN's (q k with keys formed from the
    gathered values: normed_k) and Transformer's (q k), two heads of 64."""
    from hector.kernels.attention.spec import AttentionSpec
    base = dict(heads=2, dim_v=64, has_dropout=False, dtype=dtype)
    return {"gat": AttentionSpec(dim_qk=0, has_qk=False, has_src=True, has_dst=True,
                                 negative_slope=0.2, **base),
            "agnn": AttentionSpec(dim_qk=64, has_qk=True, has_src=False, has_dst=False,
                                  negative_slope=None, normed_k=True, **base),
            "transformer": AttentionSpec(dim_qk=64, has_qk=True, has_src=False, has_dst=False,
                                         negative_slope=None, **base)}


_WGRAD_INTS = ("K", "N", "stride_xm", "stride_xk", "stride_dym", "stride_dyn", "stride_ws",
               "stride_wk", "stride_wn", "stride_bs")


def render(out: Path) -> None:
    import torch
    from hector.kernels import registry
    from hector.kernels.segment_mm.launch import gemm_params
    from hector.kernels.segment_mm.spec import GemmSpec
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for dtype in (torch.float32, torch.bfloat16):
        name = "fp32" if dtype == torch.float32 else "bf16"
        base = dict(has_gather=True, has_scatter=True, transpose_weight=False, dtype=dtype,
                    K=64, N=64)
        for what, spec in (("prologue", GemmSpec(**base, has_csr=True, gather_unique=True)),
                           ("epilogue", GemmSpec(**base, has_csr_out=True))):
            path = out / f"{what}_{name}.py"
            path.write_text(registry.source("segment_mm", **gemm_params(spec)))
            manifest.append(dict(file=path.name, kernel="segment_mm_kernel", dtype=name))
        spec = GemmSpec(**base)
        path = out / f"wgrad_{name}.py"
        path.write_text(registry.source("segment_mm_wgrad", atomic=True, has_sums=False,
                                        has_csr=True, **gemm_params(spec, True)))
        manifest.append(dict(file=path.name, kernel="segment_mm_wgrad_kernel", dtype=name))
    from hector.kernels.attention.launch import score_params
    from hector.kernels.attention.spec import AttentionSpec
    for dtype in (torch.float32, torch.bfloat16):
        name = "fp32" if dtype == torch.float32 else "bf16"
        for terms, spec in _attention_specs(dtype).items():
            for kernel, strategy, extra in _ATTN_KERNELS:
                params = dict(score_params(spec, strategy), **extra)
                if kernel == "attention_bwd_dst":
                    params.update(need_dq=spec.has_qk, need_ddst=spec.has_dst)
                elif kernel == "attention_bwd_src":
                    params.update(need_dk=spec.has_qk, need_dv=True, need_dsrc=spec.has_src)
                flags = "_".join(k for k, v in extra.items() if v is True)
                path = out / f"{kernel}_{terms}_{strategy}{'_' + flags if flags else ''}_{name}.py"
                path.write_text(registry.source(kernel, **params))
                manifest.append(dict(file=path.name, kernel=f"{kernel}_kernel", dtype=name,
                                     block_dk=1 if not spec.has_qk else 64))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(manifest)} kernels in {out}")


def compile_all(out: Path) -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    failed = 0
    print(f"triton {triton.__version__}, target sm_90")
    for item in json.loads((out / "manifest.json").read_text()):
        spec = importlib.util.spec_from_file_location(item["file"][:-3], out / item["file"])
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if item["kernel"].startswith("attention_"):
            failed += _compile_attention(triton, ASTSource, GPUTarget, mod, item)
            continue
        wgrad = item["kernel"] == "segment_mm_wgrad_kernel"
        floats = {"x", "w", "dy"}
        ptrs, ints = (_WGRAD_PTRS, _WGRAD_INTS) if wgrad else (_GEMM_PTRS, _GEMM_INTS)
        sig = {p: ("*" + item["dtype"] if p in floats else "*i64" if p == "csr_ptr"
                   else "*fp32" if p in ("out", "dw", "db", "csr_val", "bias", "addend")
                   else "*i32") for p in ptrs}
        sig.update({i: "i32" for i in ints})
        for block_m, warps in itertools.product((16, 32, 64, 128), (2, 4, 8)):
            consts = dict(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=64)
            sig.update({k: "constexpr" for k in consts})
            try:
                triton.compile(ASTSource(fn=getattr(mod, item["kernel"]), signature=dict(sig),
                                         constexprs=consts),
                               target=GPUTarget("cuda", 90, 32),
                               options=dict(num_warps=warps, num_stages=3))
                result = "OK"
            except Exception as e:      # report the first line, go on with the rest
                failed += 1
                result = "FAIL " + str(e).strip().splitlines()[0][:120]
            print(f"{item['file']:18s} block_m={block_m:3d} warps={warps}: {result}")
    return failed


def _attention_type(arg: str, dtype: str) -> str:
    if arg in _ATTN_INT_PTRS:
        return "*i32"
    if arg in _ATTN_FP32_PTRS:
        return "*fp32"
    if arg in _ATTN_SCALARS:
        return _ATTN_SCALARS[arg]
    return "*" + dtype if arg in _ATTN_DATA_PTRS else "i32"


def _compile_attention(triton, ASTSource, GPUTarget, mod, item) -> int:
    """One attention traversal kernel, its signature read off the function's argument names,
    for two warp counts; the number that failed."""
    fn = getattr(mod, item["kernel"])
    consts = dict(BLOCK_E=16, BLOCK_H=2, BLOCK_DK=item["block_dk"], BLOCK_DV=64, BLOCK_C=16)
    sig = {a: ("constexpr" if a.startswith("BLOCK_") else _attention_type(a, item["dtype"]))
           for a in fn.arg_names}
    consts = {k: v for k, v in consts.items() if k in sig}
    failed = 0
    for warps in (2, 4):
        try:
            triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts),
                           target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
            result = "OK"
        except Exception as e:      # report the first line, go on with the rest
            failed += 1
            result = "FAIL " + " | ".join(str(e).strip().splitlines())[-300:]
        print(f"{item['file']:52s} warps={warps}: {result}")
    return failed


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("render", "compile"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "render":
        render(Path(sys.argv[2]))
    else:
        sys.exit(1 if compile_all(Path(sys.argv[2])) else 0)
