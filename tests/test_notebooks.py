"""The lessons as files: listed in the README in order, saved the way nbval and the style rules want them.

nbval checks what the cells print; these tests check what a saved notebook carries: no widget state, nbval
markers as cell tags (not ``# NBVAL_...`` comments), no ``# fmt: skip`` in teaching cells, and checked
outputs that fit a notebook pane.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PANE_COLUMNS = 100
NBVAL_TAGS = {"nbval-ignore-output", "nbval-skip", "nbval-raises-exception", "nbval-check-output"}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def readme_lessons() -> list[tuple[int, str]]:
    """(number, notebook stem) of each row of the README's lessons table."""
    section = (ROOT / "README.md").read_text().split("## The lessons", 1)[1].split("\n## ", 1)[0]
    return [(int(n), stem) for n, stem in re.findall(r"^\| (\d+) \| `(\d\d_\w+)` \|", section, re.M)]


def code_cells(path: Path) -> list[dict]:
    return [cell for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"]


def test_readme_lists_every_lesson_in_order():
    rows = readme_lessons()
    assert [stem for _, stem in rows] == [path.stem for path in LESSONS]
    assert [number for number, _ in rows] == [int(path.stem[:2]) for path in LESSONS]
    assert [number for number, _ in rows] == list(range(1, len(rows) + 1)), "lessons are numbered 1, 2, 3, ..."


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_no_saved_widget_state_or_views(path):
    notebook = json.loads(path.read_text())
    assert "widgets" not in notebook["metadata"]
    for cell in code_cells(path):
        assert not [out for out in cell["outputs"] if WIDGET_VIEW in out.get("data", {})]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_markers_are_tags_and_teaching_cells_carry_no_formatter_comments(path):
    for index, cell in enumerate(code_cells(path)):
        source = "".join(cell["source"])
        assert "# NBVAL" not in source, f"code cell {index}: use a cell tag, not an # NBVAL comment"
        assert "fmt: skip" not in source, f"code cell {index}: no formatter comments in teaching cells"
        tags = set(cell.get("metadata", {}).get("tags", []))
        assert not {tag for tag in tags if tag.startswith("nbval")} - NBVAL_TAGS, f"code cell {index}: {tags}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_checked_outputs_fit_the_pane(path):
    for index, cell in enumerate(code_cells(path)):
        if NBVAL_TAGS & set(cell.get("metadata", {}).get("tags", [])):
            continue  # not compared by nbval: device-dependent text
        for out in cell["outputs"]:
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            wide = [line for line in text.splitlines() if len(line) > PANE_COLUMNS]
            assert not wide, f"code cell {index}: {len(wide[0])} characters: {wide[0][:60]}..."


def test_every_recorded_gpu_output_is_shown_in_a_checked_cell():
    """Each GPU-only cell's H200 output in h200_gpu_run.json is printed by an untagged (checked) cell."""
    recorded = json.loads((ROOT / "memviz" / "data" / "h200_gpu_run.json").read_text())["own_code"]
    checked = "".join("".join(cell["source"]) for path in LESSONS for cell in code_cells(path)
                      if not NBVAL_TAGS & set(cell.get("metadata", {}).get("tags", [])))
    assert [key for key in recorded if f'"{key}"' not in checked] == []
