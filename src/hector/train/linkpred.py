"""``hector train --task link``: knowledge-graph link prediction, R-GCN style (Schlichtkrull et
al. 2018): a learned entity table feeds a two-layer encoder over the training triples (each
relation's inverse added as its own relation), which gives every entity a row; a decoder
(:mod:`hector.nn.kge`) scores triples, and the loss is binary cross-entropy of the training
triples against negatives drawn by corrupting their heads or tails, plus an L2 penalty on the
entity rows and relation table (PyG's R-GCN link-prediction example's setup).

Every step scores one batch of training triples (``--batch-size`` triples, default all of
them) and ``--negatives`` negatives each.  The encoder runs on the whole training graph, or
with ``--fanout`` on sampled neighbourhoods of the batch's entities only (the mini-batch
machinery of :mod:`hector.loader`; the L2 penalty then covers the batch's entity rows, and
``--batch-size`` defaults to :data:`SAMPLED_BATCH`); evaluation encodes every entity on the
whole graph.
Every ``--eval-every`` epochs the filtered MRR on the validation triples (filtered by the
training and validation triples: the test triples are never read before the final
evaluation) decides early stopping (``--patience`` evaluations without a new best); with
``--lr-decay F`` each such evaluation also multiplies the learning rate by ``F`` (a step
size that stays fixed past the validation peak lets the late epochs wander off it); the best
model's test triples are then ranked, filtered by all three splits.  The last line is
``RESULT task=link ... mrr=... hits1=... hits3=... hits10=... epoch_time=<ms> ...``.
``--checkpoint PATH`` saves the run at every evaluation: the model (entity table, encoder,
decoder), the optimizer, the random states, the epoch, and the best model so far with its epoch
and validation MRR (``best``).  ``--resume PATH`` continues such a run from its last
evaluation, as if never stopped: the same losses and ranks as one uninterrupted run (on the
CPU; on a GPU up to its atomics' order).
"""
from __future__ import annotations

import copy
import sys
import time
from typing import Dict

import torch
import torch.nn.functional as F

from .. import datasets
from ..checks import check_output_file
from ..loader import NeighborLoader
from ..nn.kge import ComplEx, DistMult, TransE
from . import checkpoint
from .link import KnownTriples, corrupt, link_metrics
from .minibatch import parse_fanout
from .models import Net

#: Encoders and decoders ``--task link`` takes.
LINK_MODELS = ("rgcn", "rgat", "hgt")
DECODERS = {"distmult": DistMult, "transe": TransE, "complex": ComplEx}
#: Defaults where the command line leaves an option out (R-GCN's FB15k-237 setting, with a
#: smaller width: 500 there, on block-diagonal weights).
LINK_DEFAULTS = dict(epochs=1000, lr=0.01, hidden=200, heads=1, dropout=0.2, patience=5,
                     batch_size=None, negatives=1, reg=0.01, eval_every=50, eval_batch=512,
                     num_bases=None, decoder="distmult", clip=1.0, fanout=None, num_blocks=None,
                     edge_dropout=0.0, lr_decay=1.0)
#: Triples per step with ``--fanout`` when ``--batch-size`` is left out.
SAMPLED_BATCH = 4096


#: Node classification's options that ``--task link`` does not take (named in an error, not
#: ignored): option -> its value when left out.
NODE_ONLY = {"weight_decay": None, "prefetch": None}
#: ``--task link``'s own options, which node classification does not take.
LINK_ONLY = ("decoder", "negatives", "reg", "eval_every", "clip", "num_blocks", "edge_dropout",
             "lr_decay")


def link_config(args) -> Dict[str, object]:
    """Validate ``--task link``'s options and merge them over :data:`LINK_DEFAULTS`."""
    for key, unset in NODE_ONLY.items():
        if getattr(args, key, unset) not in (unset,):
            raise ValueError(f"--{key.replace('_', '-')} does not apply to --task link")
    if getattr(args, "dtype", "fp32") != "fp32":
        raise ValueError("--task link trains in fp32 only (drop --dtype)")
    if args.model not in LINK_MODELS:
        raise ValueError(f"--task link: --model must be one of {', '.join(LINK_MODELS)}, got "
                         f"{args.model!r}")
    cfg = dict(LINK_DEFAULTS)
    for key in LINK_DEFAULTS.keys() - {"eval_batch"}:     # (every option but that one)
        value = getattr(args, key, None)
        if value is not None:
            cfg[key] = value
    if cfg["decoder"] not in DECODERS:
        raise ValueError(f"--decoder must be one of {', '.join(DECODERS)}, got "
                         f"{cfg['decoder']!r}")
    for key in ("epochs", "hidden", "heads", "patience", "negatives", "eval_every"):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ValueError(f"--{key.replace('_', '-')} must be a positive integer, got "
                             f"{cfg[key]!r}")
    if cfg["fanout"] is not None:
        cfg["fanout"] = parse_fanout(cfg["fanout"])
        cfg["batch_size"] = cfg["batch_size"] or SAMPLED_BATCH
    if cfg["batch_size"] is not None and cfg["batch_size"] < 1:
        raise ValueError(f"--batch-size must be a positive integer, got {cfg['batch_size']}")
    if not cfg["lr"] > 0 or not cfg["reg"] >= 0 or not 0 <= cfg["dropout"] < 1 \
            or not cfg["clip"] >= 0:
        raise ValueError("--lr must be > 0, --reg >= 0, --clip >= 0 and --dropout in [0, 1)")
    if not 0 <= cfg["edge_dropout"] < 1:
        raise ValueError(f"--edge-dropout must be in [0, 1), got {cfg['edge_dropout']!r}")
    if not 0 < cfg["lr_decay"] <= 1:
        raise ValueError(f"--lr-decay must be in (0, 1], got {cfg['lr_decay']!r}")
    if cfg["edge_dropout"] and cfg["fanout"] is not None:
        raise ValueError("--edge-dropout applies to the full-graph encoder; with --fanout the "
                         "sampled neighbourhoods already pass messages over a subset of edges")
    if cfg["num_blocks"] is not None:
        if not isinstance(cfg["num_blocks"], int) or cfg["num_blocks"] < 1:
            raise ValueError(f"--num-blocks must be a positive integer, got "
                             f"{cfg['num_blocks']!r}")
        if args.model not in ("rgcn", "rgat"):
            raise ValueError(f"--num-blocks: block-diagonal relation weights are rgcn's and "
                             f"rgat's, not {args.model}'s")
        if cfg["hidden"] % cfg["num_blocks"]:
            raise ValueError(f"--num-blocks ({cfg['num_blocks']}) must divide --hidden "
                             f"({cfg['hidden']})")
    if cfg["decoder"] == "complex" and cfg["hidden"] % 2:
        raise ValueError(f"--decoder complex needs an even --hidden, got {cfg['hidden']}")
    if args.model == "hgt" and cfg["hidden"] % cfg["heads"]:
        raise ValueError(f"--hidden ({cfg['hidden']}) must be divisible by --heads "
                         f"({cfg['heads']}) for hgt")
    cfg.update(model=args.model, dataset=args.dataset, seed=args.seed, device=args.device,
               backend=args.backend or ("auto" if str(args.device).startswith("cuda")
                                        else "torch"))
    return cfg


def _splits(data):
    extra = data.extra or {}
    if "train_triples" not in extra:
        raise ValueError(f"--task link: --dataset {data.name} holds no triples (use a knowledge "
                         "graph: fb15k-237, wn18rr, fb15k, wn18, yago3-10, or 'triples' with "
                         "--root)")
    return [extra[f"{s}_triples"].long() for s in ("train", "valid", "test")]


def train_link(args, out=None) -> dict:
    """Run ``hector train --task link``; print progress and the RESULT line to ``out``."""
    from tqdm import tqdm

    out = out or sys.stdout
    t_start = time.perf_counter()
    cfg = link_config(args)
    device = torch.device(cfg["device"])
    ckpt, resume = getattr(args, "checkpoint", None), getattr(args, "resume", None)
    if ckpt:              # (checked before the dataset load and the first epoch)
        check_output_file(ckpt, "--checkpoint", create_folders=True)
    ck = (checkpoint.load(resume, device, dict(cfg, task="link"), checkpoint.LINK_KEYS,
                          checkpoint.LINK_SHAPING) if resume else None)
    if ck is not None and int(ck["epoch"]) >= cfg["epochs"]:
        raise ValueError(f"--resume {resume}: the run is at epoch {int(ck['epoch'])} already; "
                         f"nothing left of --epochs {cfg['epochs']} (raise it to continue)")
    if ck is not None and int(ck["bad_epochs"]) >= cfg["patience"]:
        raise ValueError(f"--resume {resume}: the run stopped early ({int(ck['bad_epochs'])} "
                         f"evaluations without a better MRR, --patience {cfg['patience']}); "
                         "raise --patience to continue it")
    print("settings task=link " + " ".join(f"{k}={v}" for k, v in cfg.items()), file=out,
          flush=True)
    torch.manual_seed(cfg["seed"])
    data = datasets.load(cfg["dataset"], root=getattr(args, "root", None)).to(device)
    train, valid, test = (t.to(device) for t in _splits(data))
    n, r = data.num_nodes, int(data.num_relations)
    if valid.shape[1] == 0:
        raise ValueError(f"--dataset {cfg['dataset']}: no validation triples for early stopping")
    edge_index, edge_type = encoder_edges(train, r)     # (evaluation's graph: all of them)
    h = cfg["hidden"]
    embed = torch.nn.Embedding(n, h).to(device)    # the encoder's input rows, learned
    # (glorot, not N(0, 1): unit rows through two layers give DistMult scores in the
    # hundreds, so the first losses are huge)
    torch.nn.init.xavier_uniform_(embed.weight)
    net = Net(cfg["model"], n, h, h, 2 * r, h, cfg["heads"], cfg["dropout"], cfg["num_bases"],
              cfg["backend"], num_blocks=cfg["num_blocks"]).to(device)
    decoder = DECODERS[cfg["decoder"]](r, h).to(device)
    parts = {"embed": embed, "encoder": net, "decoder": decoder}
    graph = net.graph_of(edge_index, edge_type, n)
    gen = torch.Generator(device=device).manual_seed(cfg["seed"])
    if cfg["fanout"] is None:
        encode = whole_graph(lambda: net(embed.weight, graph))
        loader = None
    else:        # (sampling the encoder's own graph)
        loader = NeighborLoader(graph, cfg["fanout"], seed=cfg["seed"])
        encode = sampled(net, embed, loader)
    params = [*embed.parameters(), *net.parameters(), *decoder.parameters()]
    opt = torch.optim.Adam(params, lr=cfg["lr"])
    known_val = KnownTriples(torch.cat([train, valid], 1), n, r)
    batch = cfg["batch_size"] or train.shape[1]
    no_progress = getattr(args, "no_progress", False) or None
    best = {"mrr": -1.0, "epoch": 0, "model": None}
    bad, epoch_times, start = 0, [], 1
    if ck is not None:
        start, best, bad = _restore(ck, resume, parts, opt, gen, device, loader)
        print(f"resumed from {resume} at epoch {start - 1}", file=out, flush=True)
    bar = tqdm(range(start, cfg["epochs"] + 1), desc=f"link {cfg['model']}/{cfg['dataset']}",
               unit="epoch", file=sys.stderr, leave=False, disable=no_progress)
    epoch = start - 1
    for epoch in bar:
        t0 = time.perf_counter()
        net.train()
        if cfg["edge_dropout"]:     # (this epoch's encoder graph: part of the triples)
            kept = dropped_edges(train, r, cfg["edge_dropout"], gen)
            epoch_graph = net.graph_of(*kept, n)
            encode = whole_graph(lambda: net(embed.weight, epoch_graph))
        mean_loss = link_epoch(encode, decoder, opt, train, n, cfg["negatives"], cfg["reg"],
                               batch, gen, cfg["clip"])
        epoch_times.append(time.perf_counter() - t0)
        if epoch % cfg["eval_every"] and epoch != cfg["epochs"]:
            continue
        val = _evaluate(embed, net, decoder, graph, valid, known_val, cfg["eval_batch"],
                        "validation", no_progress)
        print(f"epoch {epoch:4d}  loss {mean_loss:.4f}  val_mrr {val['mrr']:.4f}  "
              f"val_hits10 {val['hits10']:.4f}  time {epoch_times[-1]:.3f}s", file=out,
              flush=True)
        if val["mrr"] > best["mrr"]:
            best = {"mrr": val["mrr"], "epoch": epoch, "model": _states(parts)}
            bad = 0
        else:
            bad += 1
            for group in opt.param_groups:    # (kept in the optimizer's state: resumable)
                group["lr"] *= cfg["lr_decay"]
        if ckpt:
            checkpoint.save(ckpt, model=_states(parts), optimizer=opt.state_dict(),
                            epoch=epoch, best=best, bad_epochs=bad, rng=_rng_state(gen, loader),
                            config=dict(cfg, task="link"))
        if bad >= cfg["patience"]:
            break
    bar.close()
    for name, m in parts.items():
        m.load_state_dict(best["model"][name])
    known_all = KnownTriples(torch.cat([train, valid, test], 1), n, r)
    t_eval = time.perf_counter()
    result = _evaluate(embed, net, decoder, graph, test, known_all, cfg["eval_batch"], "test",
                       no_progress)
    eval_s = time.perf_counter() - t_eval
    result.update(task="link", model=cfg["model"], decoder=cfg["decoder"],
                  dataset=cfg["dataset"], best_epoch=best["epoch"], epochs=epoch,
                  val_mrr=best["mrr"], seed=cfg["seed"], device=str(device),
                  epoch_time=1e3 * sum(epoch_times) / max(len(epoch_times), 1),
                  test_eval_time=1e3 * eval_s, total_time_s=time.perf_counter() - t_start)
    fields = ["task", "model", "decoder", "dataset", "mrr", "hits1", "hits3", "hits10",
              "val_mrr", "best_epoch", "epochs", "seed", "device", "epoch_time",
              "test_eval_time", "total_time_s"]
    print("RESULT " + " ".join(f"{k}={_fmt(k, result[k])}" for k in fields), file=out,
          flush=True)
    return result


def _states(parts) -> dict:
    return {name: copy.deepcopy(m.state_dict()) for name, m in parts.items()}


def _rng_state(gen: torch.Generator, loader=None) -> dict:
    """Every random state a step draws from: the negatives' generator, torch's (dropout) and
    the neighbour sampler's (``--fanout``)."""
    state = {"gen": gen.get_state(), "cpu": torch.get_rng_state()}
    if loader is not None:
        state["sampler"] = loader.generator.get_state()
    if gen.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(gen.device)
    return state


def _restore(ck: dict, path, parts, opt, gen: torch.Generator, device, loader=None) -> tuple:
    """Load a ``--task link`` checkpoint into this run: (first epoch to run, best, bad
    evaluations); ValueError (one line) when it does not fit."""
    try:
        for name, m in parts.items():
            m.load_state_dict(ck["model"][name])
        opt.load_state_dict(ck["optimizer"])
        saved = ck["best"]
        best = {"mrr": float(saved["mrr"]), "epoch": int(saved["epoch"]),
                "model": saved["model"]}
        rng = ck["rng"]
        gen.set_state(rng["gen"].cpu())
        torch.set_rng_state(rng["cpu"].cpu())
        if loader is not None:
            loader.generator.set_state(rng["sampler"].cpu())
        if "cuda" in rng and torch.device(device).type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"].cpu(), torch.device(device))
        return int(ck["epoch"]) + 1, best, int(ck["bad_epochs"])
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"--resume {path}: the saved run does not fit this one "
                         f"({checkpoint.one_line(err)})") from None


def encoder_edges(train: torch.Tensor, num_relations: int):
    """The encoder's ``(edge_index, edge_type)``: every triple of ``train`` ``[3, T]`` and its
    inverse (relation ``r + num_relations``), as R-GCN builds it."""
    return (torch.cat([train[[0, 2]], train[[2, 0]]], 1),
            torch.cat([train[1], train[1] + num_relations]))


def dropped_edges(train: torch.Tensor, num_relations: int, p: float,
                  generator: torch.Generator):
    """R-GCN's edge dropout: :func:`encoder_edges` of a random ``1 - p`` of the triples (each
    kept with both its directions, or dropped with both), drawn from ``generator``."""
    keep = torch.rand(train.shape[1], generator=generator, device=train.device) >= p
    return encoder_edges(train[:, keep], num_relations)


def whole_graph(encode_all):
    """:func:`link_epoch`'s encoder from ``encode_all()``, every entity's row: the rows of the
    asked ids, and the whole table for the L2 penalty."""
    def encode(ids):
        entity = encode_all()
        return entity[ids], entity
    return encode


def sampled(net, embed, loader: NeighborLoader):
    """:func:`link_epoch`'s encoder on sampled neighbourhoods: the asked entities' rows from
    ``net`` on ``loader``'s blocks around them (each entity once), the input rows
    ``embed``'s; the batch's entity rows for the L2 penalty."""
    def encode(ids):
        uniq, inverse = torch.unique(ids, return_inverse=True)
        batch = loader.sample(uniq)
        rows = net(embed.weight.index_select(0, batch.n_id), batch.blocks, n_id=batch.n_id)
        return rows[inverse], rows
    return encode


def link_epoch(encode, decoder, opt, train: torch.Tensor, num_entities: int, negatives: int,
               reg: float, batch: int, generator: torch.Generator, clip: float = 1.0) -> float:
    """One epoch over the training triples ``[3, T]`` in batches of ``batch`` (shuffled by
    ``generator``): per batch, the entity rows of the batch and its ``negatives`` corruptions
    per triple from ``encode(ids)`` (``(rows of ids, the rows the L2 penalty averages)``:
    :func:`whole_graph` or :func:`sampled`), the decoder's scores, binary cross-entropy plus
    ``reg`` times the entity rows' and relation table's mean squares, a backward, the
    gradients' total norm clipped to ``clip`` (0: not clipped; computed on the device, no
    read) and ``opt``'s step.  The mean loss (one host read, after the epoch)."""
    dev = train.device
    order = torch.randperm(train.shape[1], generator=generator, device=dev)
    total = torch.zeros((), device=dev)
    for lo in range(0, order.numel(), batch):
        pos = train[:, order[lo:lo + batch]]
        neg = corrupt(pos, num_entities, negatives, generator)
        n_pos, n_neg = pos.shape[1], neg.shape[1]
        rows, table = encode(torch.cat([pos[0], pos[2], neg[0], neg[2]]))
        h_pos, t_pos, h_neg, t_neg = rows.split([n_pos, n_pos, n_neg, n_neg])
        scores = torch.cat([decoder(h_pos, pos[1], t_pos), decoder(h_neg, neg[1], t_neg)])
        labels = torch.cat([torch.ones(n_pos, device=dev), torch.zeros(n_neg, device=dev)])
        loss = F.binary_cross_entropy_with_logits(scores.float(), labels)
        loss = loss + reg * (table.pow(2).mean() + decoder.rel.pow(2).mean())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]],
                                           clip)
        opt.step()
        total += loss.detach() * n_pos
    return float(total) / max(train.shape[1], 1)


def _fmt(key: str, value) -> str:
    if key in ("epoch_time", "test_eval_time"):
        return f"{value:.3f}ms"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _evaluate(embed, net, decoder, graph, triples, known, batch: int, what: str,
              no_progress=None) -> Dict[str, float]:
    """Filtered metrics of ``triples`` with every entity encoded on the whole graph; a
    progress bar over the triples ranked (stderr, gone when done)."""
    from tqdm import tqdm
    net.eval()
    with torch.no_grad(), tqdm(total=triples.shape[1], desc=f"ranking {what}", unit="triple",
                               file=sys.stderr, leave=False, disable=no_progress) as bar:
        entity = net(embed.weight, graph).float()
        return link_metrics(entity, decoder, triples, known, batch_size=batch,
                            progress=bar.update)
