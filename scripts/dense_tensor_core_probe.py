"""How fast a plain (tutorial-style, grouped-tile) Triton GEMM multiplies fp32 ``[R, K] x
[K, N]`` by dot mode -- "ieee" (FMA units), "tf32x3" (three TF32 tensor-core products:
fp32's accuracy), "tf32" (one) -- next to cuBLAS's fp32 ``mm``, on the attention layers'
node-projection shapes: whether tensor cores could lift the fp32 GEMM floor of the
mid-size attention cases (issue 13).  A probe, not product code: best of eight tile
configs per mode, error against fp64.  CUDA only.

    python scripts/dense_tensor_core_probe.py

Session 31 (H200): tf32x3 1.0-1.15x the FMA kernel, plain TF32 50-67 TFLOP/s at best
(docs/data/dense-triton-probe-session31-h200.txt).
"""
import torch
import triton
import triton.language as tl

@triton.jit
def mm_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
              GROUP: tl.constexpr):
    pid = tl.program_id(0)
    npm, npn = tl.cdiv(M, BM), tl.cdiv(N, BN)
    width = GROUP * npn
    g = pid // width
    first = g * GROUP
    gs = min(npm - first, GROUP)
    pm = first + (pid % width) % gs
    pn = (pid % width) // gs
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(a + rm[:, None] * sam + (k0 + rk)[None, :] * sak,
                    mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.)
        w = tl.load(b + (k0 + rk)[:, None] * sbk + rn[None, :] * sbn,
                    mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N), other=0.)
        acc = tl.dot(x, w, acc, input_precision=PREC)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

def run(x, w, prec, BM, BN, BK, warps, stages):
    M, K = x.shape; N = w.shape[1]
    out = torch.empty(M, N, device=x.device)
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    mm_kernel[grid](x, w, out, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                    out.stride(0), out.stride(1), BM=BM, BN=BN, BK=BK, PREC=prec, GROUP=8,
                    num_warps=warps, num_stages=stages)
    return out

shapes = [(2708,128,512),(37700,128,512),(169343,128,512),(169343,128,128),(2449029,128,128),
          (169343,512,128),(169343,128,256)]
for (R,K,N) in shapes:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(R,K,generator=g).cuda(); w = (torch.randn(K,N,generator=g)/K**.5).cuda()
    want = (x.double() @ w.double())
    def err(o): return float((o.double()-want).abs().max()/want.abs().max())
    t = triton.testing.do_bench(lambda: x @ w)
    print(f"{R}x{K}x{N} cublas {t:.3f} ms err {err(x@w):.1e}", flush=True)
    for prec in ("ieee","tf32x3","tf32"):
        best = None
        for BM,BN,BK,warps,stages in ((128,128,32,8,3),(128,128,32,4,3),(128,64,32,4,4),(64,128,32,4,4),(128,256,32,8,3),(128,128,64,8,3),(64,64,32,4,4),(128,128,16,8,4)):
            if BN > max(64, N): continue
            try:
                o = run(x,w,prec,BM,BN,BK,warps,stages)
                e = err(o)
                tt = triton.testing.do_bench(lambda: run(x,w,prec,BM,BN,BK,warps,stages), warmup=5, rep=20)
            except triton.runtime.errors.OutOfResources:
                continue
            if best is None or tt < best[0]: best = (tt, (BM,BN,BK,warps,stages), e)
        fl = 2*R*K*N/best[0]/1e9
        print(f"   {prec:7} {best[0]:.3f} ms {fl:6.1f} TFLOP/s err {best[2]:.1e} cfg {best[1]}", flush=True)
