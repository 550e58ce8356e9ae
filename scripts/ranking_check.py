"""Link prediction's filtered ranking on CUDA: the fused kernel
(``hector.kernels.ranking.filtered_ranks``) against the dense ``[B, N]`` torch path, ranks
compared and timed, per score kind; then ``link_metrics`` with each backend.

    python scripts/ranking_check.py [--queries 512] [--entities 14541] [--dim 200]
        [--triples 4096] [--device cuda]

Random rows (FB15k-237's entity count by default) and up to 40 filtered entities per query.
"""
import argparse
import time

import torch

from hector.kernels.ranking import filtered_ranks
from hector.nn import ComplEx, DistMult, TransE
from hector.train.link import KnownTriples, link_metrics


def timed(fn, device, n=10):
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, (time.perf_counter() - t) / n * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=512)
    p.add_argument("--entities", type=int, default=14541)
    p.add_argument("--dim", type=int, default=200)
    p.add_argument("--triples", type=int, default=4096)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    dev = torch.device(a.device)
    g = torch.Generator(device=dev).manual_seed(0)
    b, n, d = a.queries, a.entities, a.dim
    ent = torch.randn(n, d, device=dev, generator=g)
    q = torch.randn(b, d, device=dev, generator=g)
    truth = torch.randint(0, n, (b,), device=dev, generator=g)
    count = torch.randint(0, 40, (b,), device=dev, generator=g)
    ptr = torch.cat([count.new_zeros(1), count.cumsum(0)])
    col = torch.randint(0, n, (int(ptr[-1]),), device=dev, generator=g)
    kernel = "triton" if dev.type == "cuda" else "torch"
    print(f"device={torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'} "
          f"B={b} N={n} D={d}")
    print("| kind | fused ms | dense ms | ranks differing |")
    print("|---|---|---|---|")
    for kind in ("dot", "l1", "l2"):
        fused, t_fused = timed(lambda: filtered_ranks(q, ent, kind, truth, ptr, col,
                                                      backend=kernel), dev)
        dense, t_dense = timed(lambda: filtered_ranks(q, ent, kind, truth, ptr, col,
                                                      backend="torch"), dev)
        print(f"| {kind} | {t_fused:.3f} | {t_dense:.3f} | {int((fused != dense).sum())} |")
    r = 50
    triples = torch.stack([torch.randint(0, n, (a.triples,), device=dev, generator=g),
                           torch.randint(0, r, (a.triples,), device=dev, generator=g),
                           torch.randint(0, n, (a.triples,), device=dev, generator=g)])
    known = KnownTriples(triples, n, r)
    print("| decoder | link_metrics fused ms | dense ms | mrr fused | mrr dense |")
    print("|---|---|---|---|---|")
    for name, dec in (("DistMult", DistMult(r, d)), ("TransE", TransE(r, d)),
                      ("ComplEx", ComplEx(r, d))):
        dec = dec.to(dev)
        m_f, t_f = timed(lambda: link_metrics(ent, dec, triples, known, backend=kernel), dev, 3)
        m_d, t_d = timed(lambda: link_metrics(ent, dec, triples, known, backend="torch"),
                         dev, 3)
        print(f"| {name} | {t_f:.1f} | {t_d:.1f} | {m_f['mrr']:.5f} | {m_d['mrr']:.5f} |")


if __name__ == "__main__":
    main()
