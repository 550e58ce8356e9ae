"""``hector bench``: hector's layers against PyG's (eager, and torch.compile on CUDA) on one
dataset each: output check, inference and training time, peak memory, speedups.

``configure(parser)`` adds the options to an argparse parser and ``run(args)`` runs them
(returns the exit status: 1 when a hector layer's output did not match PyG or a case raised).
``run_bench(BenchConfig(...))`` is the programmatic entry point.
"""
from __future__ import annotations

import argparse
import sys

from ..checks import check_output_file
from . import report
from .paper import SUITES
from .runner import BenchConfig, failed, require, resolve, run_bench
from .suites import LAYERS

__all__ = ["BenchConfig", "run_bench", "resolve", "configure", "run", "main", "LAYERS"]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", default=None,
                   help=f"comma list from {','.join(LAYERS)} (default: rgcn,gat; with --suite: "
                        "all of the suite's layers)")
    p.add_argument("--suite", default=None, choices=SUITES + ("all",),
                   help="run a paper suite instead of one dataset: hetero (RGCN/RGAT/HGT on the "
                        "8 heterogeneous profiles), attention (GAT/AGNN/Transformer on 6 profiles "
                        "and the real graphs under --data-root), or all")
    p.add_argument("--datasets", default=None,
                   help="with --suite: comma list of the suite's datasets to run (profile "
                        "names such as mag,wikikg2, or cora, amazon-computers, github-musae)")
    p.add_argument("--data-root", default=None,
                   help="with --suite attention: folder holding cora/, amazon-computers/ and "
                        "github-musae/ (e.g. ../shared/data); graphs absent there are left out")
    p.add_argument("--dataset", default=None,
                   help="a loader name (aifb, cora, ...) or synthetic:PROFILE, for every layer "
                        "(default: synthetic:aifb for rgcn/rgat/hgt, synthetic:cora for "
                        "gat/agnn/transformer)")
    p.add_argument("--root", default=None, help="local folder holding --dataset's files")
    p.add_argument("--scale", type=float, default=None,
                   help="size factor for synthetic profiles (default: the profile's size; on "
                        "the CPU the default relational dataset runs at 0.2)")
    p.add_argument("--features", type=int, default=None,
                   help="input and output feature width (default: 64 on CUDA, 32 on the CPU)")
    p.add_argument("--heads", type=int, default=1, help="attention heads (default 1)")
    p.add_argument("--device", default=None,
                   help="cuda or cpu (default: cuda if available, else cpu)")
    p.add_argument("--repeats", type=int, default=5,
                   help="CPU timing: at least this many runs after one warm-up, more while "
                        "their spread is wide (default 5; on CUDA triton's do_bench decides)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads while timing (default 1 on the CPU: comparable "
                        "across machines and under other load; printed in the header)")
    p.add_argument("--seed", type=int, default=0, help="seed for synthetic datasets and features")
    p.add_argument("--json", metavar="PATH", default=None, help="write all results as JSON")
    p.add_argument("--markdown", metavar="PATH", default=None, help="write the table as markdown")
    p.add_argument("--plot", metavar="PATH", default=None,
                   help="write a PNG bar chart of the speedups over PyG eager")
    p.add_argument("--no-pyg", action="store_true",
                   help="leave PyG out: not timed, not imported (hector's layers are then "
                        "seeded on their own and their output is not checked: 'no ref')")
    p.add_argument("--no-compile", action="store_true",
                   help="do not time PyG under torch.compile and torch.compile(mode="
                        "'reduce-overhead') (on CUDA both are timed by default)")
    p.add_argument("--no-capture", action="store_true",
                   help="do not time hector captured in CUDA graphs (on CUDA it is timed by "
                        "default)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="storage dtype of the features, parameters and messages of every peer "
                        "(hector accumulates in fp32); the check's tolerance follows it "
                        "(default fp32)")
    p.add_argument("--tf32", action="store_true",
                   help="run every peer's fp32 matrix products on TF32 tensor cores "
                        "(torch.backends.cuda.matmul.allow_tf32; hector's GEMMs follow it)")
    p.add_argument("--no-grad-check", action="store_true",
                   help="check hector's output only, not its input gradient")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(layers=args.layers, dataset=args.dataset, root=args.root,
                       scale=args.scale, features=args.features, heads=args.heads,
                       device=args.device, repeats=args.repeats, no_pyg=args.no_pyg,
                       seed=getattr(args, "seed", 0),
                       progress=not getattr(args, "no_progress", False),
                       suite=getattr(args, "suite", None),
                       datasets=getattr(args, "datasets", None),
                       data_root=getattr(args, "data_root", None),
                       compile_pyg=False if getattr(args, "no_compile", False) else None,
                       capture=False if getattr(args, "no_capture", False) else None,
                       check_grad=not getattr(args, "no_grad_check", False),
                       threads=getattr(args, "threads", None),
                       dtype=getattr(args, "dtype", "fp32"),
                       tf32=getattr(args, "tf32", False))


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; prints the table; writes --json / --markdown / --plot.  Bad options
    raise ValueError (naming the option) before anything runs."""
    cfg = resolve(config_from_args(args))        # validate before any work
    if args.plot:
        require("matplotlib", "--plot")
    for option in ("json", "markdown", "plot"):
        if getattr(args, option):
            check_output_file(getattr(args, option), f"--{option}")
    save = (lambda partial: report.write_json(partial, args.json)) if args.json else None
    result = run_bench(cfg, on_case=save)
    print(report.table(result), flush=True)
    report.write_all(result, json=args.json, markdown=args.markdown, plot=args.plot)
    return 1 if failed(result) else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hector bench", description=__doc__.split("\n\n")[0])
    configure(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except ValueError as err:
        print(f"hector bench: error: {err}", file=sys.stderr)    # (as the hector CLI does)
        return 2
