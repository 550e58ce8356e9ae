"""Compile the segment GEMM's CSR kernels and the attention forward for an sm_90 target
without a GPU, with whatever Triton is installed (the device machines run Triton 3.6; this
machine's wheel may differ).

    python scripts/triton_compile_check.py render DIR      # with hector's environment
    python scripts/triton_compile_check.py compile DIR     # with the Triton to check, e.g.
        python -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0
        /tmp/t36/bin/python scripts/triton_compile_check.py compile DIR

``render`` writes the kernel sources hector renders for the CSR prologue, the CSR scatter
epilogue and the CSR weight gradient (fp32 and bf16, K = N = 64), the edge-parallel
attention forward with and without the in-traversal merge of cut rows (``merge_last``;
GAT's terms, fp32 and bf16) and a manifest; ``compile``
runs each through ``triton.compile`` (every pass up to PTX and ptxas, no driver needed)
for several row tiles and warp counts and prints OK or the first error line.  How Triton
3.6's "'tt.load' op failed to verify that mask type matches ptr type" in the CSR walks was
found and checked (docs/perf-notes.md, "Session 22").
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
#: The attention forward's arguments (kernels/attention/templates/attention_fwd.py.j2).
_ATTN_INT_PTRS = ("ptr", "col", "eid", "chunk_rows", "row_ids", "dst_index", "counts")
_ATTN_FLOAT_PTRS = ("q", "k", "v", "a_src", "a_dst", "bias", "out")
_ATTN_FP32_PTRS = ("k_norm", "lse", "m_part", "l_part", "acc_part")
_ATTN_SCALARS = dict(scale="fp32", slope="fp32", seed="*i64", drop_threshold="i32",
                     drop_scale="fp32")
_ATTN_INTS = ("E", "H", "DK", "DV", "SQ", "SK", "SV", "SAS", "SAD", "SB", "CHUNK")
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
        spec = AttentionSpec(heads=2, dim_qk=0, dim_v=64, has_qk=False, has_src=True,
                             has_dst=True, negative_slope=0.2, has_dropout=False,
                             dtype=dtype)
        for merge in (False, True):
            path = out / f"attention_fwd_{'merge_' if merge else ''}{name}.py"
            path.write_text(registry.source("attention_fwd", **score_params(spec, "edge"),
                                            has_bias=True, merge_last=merge))
            manifest.append(dict(file=path.name, kernel="attention_fwd_kernel", dtype=name))
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
        if item["kernel"] == "attention_fwd_kernel":
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


def _compile_attention(triton, ASTSource, GPUTarget, mod, item) -> int:
    """The attention forward for a few edge tiles and warp counts; the number that failed."""
    sig = {p: "*i32" for p in _ATTN_INT_PTRS}
    sig.update({p: "*" + item["dtype"] for p in _ATTN_FLOAT_PTRS})
    sig.update({p: "*fp32" for p in _ATTN_FP32_PTRS})
    sig.update(_ATTN_SCALARS)
    sig.update({i: "i32" for i in _ATTN_INTS})
    order = ("ptr", "col", "eid", "chunk_rows", "row_ids", "q", "k", "v", "a_src", "a_dst",
             "dst_index", "k_norm", "bias", "out", "lse", "m_part", "l_part", "acc_part",
             "counts") + tuple(_ATTN_SCALARS) + _ATTN_INTS
    failed = 0
    for block_e, warps in itertools.product((16, 32), (2, 4)):
        consts = dict(BLOCK_E=block_e, BLOCK_H=2, BLOCK_DK=1, BLOCK_DV=64, BLOCK_C=16)
        full = {name: sig[name] for name in order}
        full.update({k: "constexpr" for k in consts})
        try:
            triton.compile(ASTSource(fn=mod.attention_fwd_kernel, signature=full,
                                     constexprs=consts),
                           target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps))
            result = "OK"
        except Exception as e:      # report the first line, go on with the rest
            failed += 1
            result = "FAIL " + str(e).strip().splitlines()[0][:160]
        print(f"{item['file']:28s} block_e={block_e:3d} warps={warps}: {result}")
    return failed


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("render", "compile"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "render":
        render(Path(sys.argv[2]))
    else:
        sys.exit(1 if compile_all(Path(sys.argv[2])) else 0)
