"""``python -m memviz.fit``: will a PyTorch program fit on a GPU? Predicted with no GPU.

Examples::

    python -m memviz.fit train.py:main --device A100-40GB --kw batch=64
    python -m memviz.fit memviz.examples:gpt_training --device H200 --cap "8 GiB" --kw checkpoint=True
    python -m memviz.fit memviz.examples:resnet_training --max-batch --cap "6 GiB" --kw depth=50
    python -m memviz.fit memviz.examples:mlp_training --all-devices --max-batch

The program is ``FILE.py:FUNCTION`` or ``MODULE:FUNCTION``, called with the ``--kw NAME=VALUE`` keyword
arguments (values are Python literals: ``64``, ``True``, ``'bf16'``). ``--max-batch`` bisects the largest
value of ``--batch-arg`` (default ``batch``) that fits. Exit status: 0 when it fits, 1 when it does not,
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["load_function", "main", "parse_kwargs"]


def load_function(spec: str) -> Callable[..., Any]:
    """The function named by ``FILE.py:NAME`` or ``MODULE:NAME``.

    Raises:
        ValueError: no ``:NAME``, the file or module does not exist, or it has no such callable.
    """
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ValueError(f"program {spec!r} must be FILE.py:FUNCTION or MODULE:FUNCTION, e.g. train.py:main")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"program file {target!r} does not exist")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.path.insert(0, str(path.resolve().parent))
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ValueError(f"cannot import module {target!r}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{target!r} has no function {name!r}")
    return fn


def parse_kwargs(items: list[str]) -> dict[str, Any]:
    """``["batch=64", "amp=True"]`` → ``{"batch": 64, "amp": True}`` (Python literals; else the string)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"--kw {item!r} must be NAME=VALUE, e.g. --kw batch=64")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def _parser() -> argparse.ArgumentParser:
    from memviz.predictor import DEVICES

    p = argparse.ArgumentParser(prog="python -m memviz.fit", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("program", help="FILE.py:FUNCTION or MODULE:FUNCTION")
    p.add_argument("--device", default="A100-40GB", help=f"a preset ({', '.join(DEVICES)}) or a size like '24 GiB'")
    p.add_argument("--all-devices", action="store_true", help="every preset, one line each")
    p.add_argument("--cap", default=None, help="the allocator's limit, e.g. '8 GiB' (set_per_process_memory_fraction)")
    p.add_argument("--alloc-conf", default=None, help="a PYTORCH_CUDA_ALLOC_CONF string")
    p.add_argument("--kw", action="append", default=[], metavar="NAME=VALUE", help="a keyword argument of the program")
    p.add_argument("--max-batch", action="store_true", help="bisect the largest batch that fits")
    p.add_argument("--batch-arg", default="batch", help="the keyword --max-batch varies (default: batch)")
    p.add_argument("--lo", type=int, default=1, help="--max-batch's smallest batch (default 1)")
    p.add_argument("--hi", type=int, default=None, help="--max-batch's largest batch (default: none)")
    p.add_argument("--world-size", type=int, default=None, metavar="N",
                   help="a torchrun program: predict it as a rank of N (torch's fake process group)")
    p.add_argument("--rank", default="0", metavar="R|all", help="with --world-size: the rank (default 0), or all")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    from tqdm import tqdm

    import memviz.predictor as mp
    from memviz.errors import InputError

    args = _parser().parse_args(argv)
    try:
        fn = load_function(args.program)
        kwargs = parse_kwargs(args.kw)
    except ValueError as e:
        print(f"memviz.fit: {e}", file=sys.stderr)
        return 2
    rank: int | str = "all" if args.rank == "all" else int(args.rank) if args.rank.lstrip("-").isdigit() else args.rank
    job = {} if args.world_size is None else {"world_size": args.world_size, "rank": rank}
    devices = list(mp.DEVICES) if args.all_devices else [args.device]
    results, all_fit = [], True
    for device in devices:
        bar = None if args.no_progress else tqdm(desc=str(device), unit=" try" if args.max_batch else " alloc",
                                                 leave=False, file=sys.stderr)

        def progress(done: int, total: int | None, message: str, bar: Any = bar) -> None:
            if bar is not None:
                bar.n = done
                bar.set_postfix_str(message, refresh=True)

        try:
            if args.max_batch:
                best = mp.max_batch(lambda b: fn(**{**kwargs, args.batch_arg: b}), device=device, cap=args.cap,
                                    alloc_conf=args.alloc_conf, lo=args.lo, hi=args.hi, on_progress=progress, **job)
                row = {"device": str(device), "max_batch": best}
                all_fit &= best > 0
                text = f"{device}: largest {args.batch_arg} that fits = {best}"
            else:
                p = mp.predict(fn, device=device, cap=args.cap, alloc_conf=args.alloc_conf, on_progress=progress,
                               **job, **kwargs)
                if isinstance(p, mp.RankPredictions):
                    row = {"device": str(device), "world_size": p.world_size, "fits": p.fits, "ranks": p.table()}
                    all_fit &= p.fits
                    text = f"{device}: {p.summary()}"
                    results.append(row)
                    if not args.json:
                        print(text)
                    if bar is not None:
                        bar.close()
                    continue
                row = {"device": str(device), "fits": p.fits, "peak_allocated_bytes": p.peak_allocated_bytes,
                       "peak_reserved_bytes": p.peak_reserved_bytes, "breakdown_at_peak": p.breakdown(),
                       "oom": None if p.oom is None else str(p.oom), "notes": p.notes,
                       "seconds": round(p.trace_seconds, 2)}
                all_fit &= p.fits
                text = p.summary()
        except (ValueError, mp.DataDependentError, InputError) as e:
            if bar is not None:
                bar.close()
            print(f"memviz.fit: {e}", file=sys.stderr)
            return 2
        if bar is not None:
            bar.close()
        results.append(row)
        if not args.json:
            print(text)
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=1))
    return 0 if all_fit else 1


if __name__ == "__main__":
    sys.exit(main())
