"""The ``hector`` command line.  Each subcommand is a (configure, run) pair in ``COMMANDS``.

Exit status, the same for every command: 0 done; 2 a usage error -- options argparse
refuses, or values and paths the command refuses (unknown names, missing dataset files, a
file that is not a checkpoint, an output path that cannot be written), one ``error:`` line;
1 a failure while running -- a download that failed or another operating-system error (one
line), a hector layer that did not match PyG in ``bench``, or an unexpected error (with its
traceback, which is what a bug report needs).  hector's own warnings print as one
``warning:`` line on stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from . import bench, datasets, train
from ._version import __version__
from .checks import check_device_option
from .compiler import explain as explain_command
from .datasets.download import DownloadError
from .graph import Graph


def _configure_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", help="a loader name (aifb, cora, fb15k-237, ...), or "
                                   "synthetic:PROFILE (synthetic:mag, synthetic:reddit, ...)")
    p.add_argument("--root", help="local folder holding the dataset's files (default: download "
                                  "into $HECTOR_DATA, ~/.cache/hector)")
    p.add_argument("--device", default="cpu", help="where to build the Graph (cpu, cuda)")
    p.add_argument("--scale", type=float, default=None,
                   help="size factor for synthetic profiles (1.0 = published size)")
    p.add_argument("--seed", type=int, default=0, help="seed for synthetic profiles and splits")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")


def _run_info(args: argparse.Namespace) -> int:
    device = check_device_option(args.device)   # before the load: fail fast, in one line
    kwargs = {"seed": args.seed}
    if args.scale is not None:
        kwargs["scale"] = args.scale
    t0 = time.perf_counter()
    data = datasets.load(args.dataset, root=args.root, **kwargs)
    t_load = time.perf_counter() - t0
    data = data.to(device)
    _sync(device)
    t0 = time.perf_counter()
    graph: Graph = data.graph
    _sync(device)
    t_build = time.perf_counter() - t0
    stats = graph.summary()
    stats.update(dataset=data.name, load_seconds=round(t_load, 3), build_seconds=round(t_build, 3),
                 num_features=None if data.x is None else int(data.x.shape[1]),
                 num_classes=data.num_classes, split=_split_sizes(data))
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        print(format_info(stats))
    return 0


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _split_sizes(data) -> Dict[str, Optional[int]]:
    return {k: (None if getattr(data, f"{k}_idx") is None else int(getattr(data, f"{k}_idx").numel()))
            for k in ("train", "val", "test")}


def format_info(s: dict) -> str:
    """Human-readable statistics (numbers with thousands separators, longest lists cut)."""
    d_in, d_out = s["in_degree"], s["out_degree"]
    lines = [
        f"dataset        {s['dataset']}",
        f"nodes          {s['num_nodes']:,}   ({s['num_node_types']} node type"
        f"{'s' if s['num_node_types'] != 1 else ''})",
        f"edges          {s['num_edges']:,}",
        f"relations      {s['num_relations']}",
        f"features       {s['num_features'] if s['num_features'] is not None else '-'}",
        f"classes        {s['num_classes'] or '-'}",
        "split          " + ", ".join(f"{k} {v:,}" for k, v in s["split"].items() if v is not None),
        f"in-degree      max {d_in['max']:,}, mean {d_in['mean']:.2f}, cv {d_in['cv']:.2f}, "
        f"isolated {d_in['num_isolated']:,}",
        f"out-degree     max {d_out['max']:,}, mean {d_out['mean']:.2f}, cv {d_out['cv']:.2f}",
        f"super nodes    {d_in['num_super']:,} with in-degree >= {d_in['super_threshold']:,}",
        f"compact rows   {s['compact_src_rows']:,} unique (src, relation), "
        f"{s['compact_dst_rows']:,} unique (dst, relation)",
        f"graph memory   {s['nbytes'] / 2**20:,.1f} MiB ({s['index_dtype']} indices, {s['device']})",
        f"time           load {s['load_seconds']:.2f} s, Graph build {s['build_seconds']:.3f} s",
    ]
    if s["num_node_types"] > 1:
        lines.append("node types     " + ", ".join(f"{k} {v:,}" for k, v in s["nodes_per_type"].items()))
    rels = sorted(s["edges_per_relation"].items(), key=lambda kv: -kv[1])
    shown = ", ".join(f"{k} {v:,}" for k, v in rels[:8])
    more = f", ... ({len(rels) - 8} more)" if len(rels) > 8 else ""
    lines.append(f"edges/relation {shown}{more}")
    return "\n".join(lines)


def _attention_layer(model: str, in_dim: int, out_dim: int, heads: int) -> torch.nn.Module:
    """``hector explain``'s attention layer (AGNN keeps its input width: no projection)."""
    from . import nn
    if model == "agnn":
        return nn.AGNNConv()
    cls = nn.GATConv if model == "gat" else nn.TransformerConv
    return cls(in_dim, out_dim, heads=heads)


COMMANDS: Dict[str, Tuple[str, Callable, Callable]] = {
    "train": ("train a model end to end (entity or node classification) and report test "
              "accuracy", train.configure, train.run),
    "bench": ("time hector against PyG on your graph (inference, training, memory)",
              bench.configure, bench.run),
    "info": ("print a dataset's statistics", _configure_info, _run_info),
    "explain": ("show a model's IR before and after each pass, the decisions, the plan and "
                "the kernels", explain_command.configure,
                lambda args: explain_command.run(args, _attention_layer)),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hector", description="Fast GNN layers on GPUs.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, configure, _) in COMMANDS.items():
        configure(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def _version() -> str:
    return f"hector {__version__}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        with warnings.catch_warnings():      # (restores showwarning when the command ends)
            warnings.showwarning = _one_line_warnings(args.command, warnings.showwarning)
            return COMMANDS[args.command][2](args)
    except BrokenPipeError:
        # Output piped into a reader that stopped early (`hector info ... | head`): not an error.
        sys.stdout = open(os.devnull, "w")
        return 0
    except (ValueError, TypeError, FileNotFoundError, PermissionError, IsADirectoryError,
            NotADirectoryError) as err:
        # Bad input (a value or a path given) is the user's to fix: one clear line, no traceback.
        print(f"hector {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (DownloadError, OSError) as err:
        # No network, a failing server, a full disk: the run failed, not its options.  One
        # line (a download's names the URL and the --root way out).
        print(f"hector {args.command}: error: {err}", file=sys.stderr)
        return 1


_PACKAGE = str(Path(__file__).resolve().parent) + os.sep


def _one_line_warnings(command: str, fallback):
    """``warnings.showwarning`` for a command: hector's own warnings as one ``hector COMMAND:
    warning: ...`` line on stderr (not Python's file:line and source echo); others as
    Python shows them."""
    def show(message, category, filename, lineno, file=None, line=None):
        if str(Path(filename).resolve()).startswith(_PACKAGE):
            print(f"hector {command}: warning: {message}", file=file or sys.stderr)
        else:
            fallback(message, category, filename, lineno, file, line)
    return show


if __name__ == "__main__":
    sys.exit(main())
