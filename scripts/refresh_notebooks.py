"""Re-execute lesson notebooks in place so their saved outputs are what `pytest --nbval` checks.

    python scripts/refresh_notebooks.py [notebooks/NN_name.ipynb ...]    (default: every notebook)

Runs each notebook top to bottom in a fresh kernel of this environment (on the simulator when there is
no GPU: the saved numbers are the simulator's), then keeps it small: no saved widget state, no widget
views (they cannot render without that state), stream chunks merged, sequential execution counts and
stable cell ids. It then names what the lessons' style rules forbid: output lines wider than a notebook
pane (100 characters), and nbval markers written as comments (``# NBVAL_...``) instead of cell tags
(``nbval-ignore-output`` etc.).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PANE_COLUMNS = 100


def refresh(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.metadata.pop("widgets", None)
    count = 0
    for index, cell in enumerate(nb.cells):
        cell.id = f"{path.stem[:2]}-{index:02d}"
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        count += 1
        cell.execution_count = count
        cell.outputs = coalesce_streams([out for out in cell.outputs if WIDGET_VIEW not in out.get("data", {})])
        for out in cell.outputs:
            if "execution_count" in out:
                out["execution_count"] = count
    nbformat.write(nb, path)
    print(f"refreshed {path} ({path.stat().st_size // 1024} KiB)")
    for problem in style_problems(nb):
        print(f"  {path.name}: {problem}")


def coalesce_streams(outputs: list) -> list:
    """Consecutive stdout (or stderr) chunks as one output: how the kernel split them depends on timing."""
    merged: list = []
    for out in outputs:
        last = merged[-1] if merged else None
        if out.output_type == "stream" and last is not None and last.output_type == "stream" and last.name == out.name:
            last.text += out.text
        else:
            merged.append(out)
    return merged


def style_problems(nb: nbformat.NotebookNode) -> list[str]:
    """Output lines wider than the pane, and nbval markers written as comments, cell by cell."""
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if any(line.lstrip().startswith("# NBVAL") for line in cell.source.splitlines()):
            problems.append(f"cell {index}: an nbval marker as a comment; use a cell tag")
        for out in cell.outputs:
            text = out.get("text", "") + out.get("data", {}).get("text/plain", "")
            widest = max((len(line) for line in text.splitlines()), default=0)
            if widest > PANE_COLUMNS:
                problems.append(f"cell {index}: an output line of {widest} characters (pane: {PANE_COLUMNS})")
    return problems


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or sorted(Path("notebooks").glob("[0-9]*.ipynb"))
    for path in paths:
        refresh(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
