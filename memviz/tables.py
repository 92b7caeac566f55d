"""Plain-text tables: the one layout every report prints (what-if replays, config comparisons)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

__all__ = ["format_table"]


def format_table(rows: Sequence[Sequence[str]], left_columns: int = 1, footer: str | None = None) -> str:
    """Lay out ``rows`` (the headers first, a header's lines split at ``\\n``) as plain text: the first
    ``left_columns`` columns left-aligned, the others right-aligned, two spaces apart, a rule under the headers,
    then ``footer`` (e.g. :meth:`~memviz.snapshots.FidelityReport.describe`) wrapped at the table's width
    (default: none).

    >>> print(format_table([("config", "peak\\nreserved"), ("default", "1.00 GiB")]))
                 peak
    config   reserved
    -----------------
    default  1.00 GiB
    """
    heads = [h.split("\n") for h in rows[0]]
    depth = max(len(h) for h in heads)
    heads = [[""] * (depth - len(h)) + h for h in heads]  # a one-line header sits on the last line
    head_rows = [[h[k] for h in heads] for k in range(depth)]
    body = [list(r) for r in rows[1:]]
    widths = [max(len(r[c]) for r in head_rows + body) for c in range(len(heads))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(t.ljust(w) if c < left_columns else t.rjust(w)
                         for c, (t, w) in enumerate(zip(row, widths, strict=True))).rstrip()  # fmt: skip

    width = sum(widths) + 2 * (len(widths) - 1)
    foot = [] if footer is None else textwrap.wrap(footer, width)
    return "\n".join([*map(line, head_rows), "-" * width, *map(line, body), *foot])
