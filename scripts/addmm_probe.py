"""Which torch spellings of the reordered Transformer's last product and additions copy:
eager times (``triton.testing.do_bench``) of the products and additions of
``nn/_reorder.messages`` on synthetic arxiv's shape (``[169343, 128]`` rows, 128 wide), each
spelling alone.  CUDA only.

    python scripts/addmm_probe.py [--rows 169343] [--width 128]

Session 31 (H200): a strided-addend ``addmm`` 0.256 ms against ``mm`` 0.164 (+ an add); the
masked bias as a rank-1 ``addmm`` 0.105 against ``addcmul`` 0.071
(docs/data/addmm-probe-session31-h200.txt).
"""
import argparse

import torch
import triton


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=169343)
    p.add_argument("--width", type=int, default=128)
    a = p.parse_args()
    n, f = a.rows, a.width
    dev = torch.device("cuda")
    x, agg = torch.randn(n, f, device=dev), torch.randn(n, f, device=dev)
    w2, b2 = torch.randn(2 * f, f, device=dev), torch.randn(2 * f, device=dev)
    wv, bv = torch.randn(f, f, device=dev), torch.randn(f, device=dev)
    mask = (torch.rand(n, 1, device=dev) > 0.1).float()
    x_r = torch.nn.functional.linear(x, w2, b2)[:, f:]       # the skip: a column slice
    x_rc = x_r.contiguous()
    cases = {
        "linear(x, W2, b2)": lambda: torch.nn.functional.linear(x, w2, b2),
        "linear(x, W2)": lambda: torch.nn.functional.linear(x, w2),
        "addmm(strided x_r, agg, wv^T)": lambda: torch.addmm(x_r, agg, wv.t()),
        "addmm(contiguous x_r, agg, wv^T)": lambda: torch.addmm(x_rc, agg, wv.t()),
        "agg @ wv^T + x_r": lambda: agg @ wv.t() + x_r,
        "agg @ wv^T": lambda: agg @ wv.t(),
        "addmm(out, mask, bv) (rank 1)": lambda: torch.addmm(x_rc, mask, bv.unsqueeze(0)),
        "addcmul(out, mask, bv)": lambda: torch.addcmul(x_rc, mask, bv),
        "out + mask * bv": lambda: x_rc + mask * bv,
    }
    for name, fn in cases.items():
        print(f"{name:36} {triton.testing.do_bench(fn):.3f} ms", flush=True)


if __name__ == "__main__":
    main()
