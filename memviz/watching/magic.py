"""The ``%%memviz`` cell magic: watch a whole cell, unchanged, with ``%load_ext memviz`` once.

::

    %load_ext memviz

    %%memviz                      # the current GPU; %%memviz lab (a Lab in your namespace), %%memviz 1 (GPU 1),
    for batch in loader:          # %%memviz "run/stats.jsonl" (a job's stats file)
        ...

Options: ``-i SECONDS`` (between samples, default 0.1), ``-o NAME`` (keep the :class:`~memviz.watching.Watch`
in your namespace as ``NAME``), ``--no-history`` (no memory history on a GPU), ``--raise-oom`` (raise an
out-of-memory error instead of keeping it in the watch). The cell runs in your namespace, as without the magic;
the value of its last line is shown, as IPython shows a cell's.
"""

from __future__ import annotations

import ast
import shlex
from typing import Any

from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from memviz.errors import InputError
from memviz.watching.watch import watch

__all__ = ["WatchMagics", "load_ipython_extension"]


@magics_class
class WatchMagics(Magics):
    """``%%memviz``: see the module docstring."""

    @magic_arguments()
    @argument("source", nargs="?", default=None,
              help="a Lab in your namespace, a CUDA device index, or a quoted stats file path (default: the GPU)")
    @argument("-i", "--interval", type=float, default=0.1, help="seconds between samples (default 0.1)")
    @argument("-o", "--out", default=None, help="keep the Watch in your namespace under this name")
    @argument("--no-history", action="store_true", help="do not record the memory history on a GPU")
    @argument("--raise-oom", action="store_true", help="raise an out-of-memory error that ends the cell")
    @cell_magic
    def memviz(self, line: str, cell: str) -> Any:
        """Watch the cell's memory live while it runs (``memviz.watch()`` around the whole cell)."""
        args = parse_argstring(self.memviz, line)
        if args.out is not None and not args.out.isidentifier():
            raise InputError(f"-o takes a Python name to keep the watch under, not {args.out!r}")
        shell = self.shell
        code = shell.transform_cell(cell)
        tree = shell.compile.ast_parse(code)  # a syntax error is raised here, before anything runs
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        w = watch(self._source(args.source), interval_s=args.interval, history=not args.no_history,
                  raise_oom=args.raise_oom)  # fmt: skip
        if args.out is not None:
            shell.user_ns[args.out] = w
        namespace = shell.user_ns
        result = None
        with w:
            exec(shell.compile(tree, "<memviz cell>", "exec"), namespace)
            if last is not None:
                result = eval(shell.compile(ast.Expression(last.value), "<memviz cell>", "eval"), namespace)
        return result

    def _source(self, text: str | None) -> Any:
        if text is None:
            return None
        if text.isdigit():
            return int(text)
        if text[0] in "\"'":
            return shlex.split(text)[0]
        if text.isidentifier() and text in self.shell.user_ns:
            return self.shell.user_ns[text]
        raise InputError(f"%%memviz {text}: not a name in your namespace, a device index or a quoted path "
                         "(e.g. %%memviz lab, %%memviz 0, %%memviz \"run/stats.jsonl\")")


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%memviz`` (``%load_ext memviz``)."""
    ipython.register_magics(WatchMagics)
