"""Where a recorded allocation came from: the user's own frame of a snapshot stack.

``_record_memory_history(stacks="python")`` records each allocation's Python stack, innermost first, as
``{"filename", "line", "name"}`` dicts (``stacks="all"`` adds C++ frames, whose file names do not end in
``.py``). The frame a reader wants is the innermost one in their own code: not in an installed package
(``site-packages``/``dist-packages``), not in torch, and not in memviz itself (a lab's tensors are made by
memviz's backend, on the user's call).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["frame_label", "user_frames"]

_MEMVIZ_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARY_PARTS = ("-packages", f"{os.sep}torch{os.sep}")


def _python(frames: Any) -> list[Mapping]:
    return [f for f in frames or () if isinstance(f, Mapping) and str(f.get("filename", "")).endswith(".py")]


def _mine(frame: Mapping) -> bool:
    name = str(frame["filename"])
    return not any(part in name for part in _LIBRARY_PARTS) and not os.path.abspath(name).startswith(_MEMVIZ_DIR)


def user_frames(frames: Any) -> list[Mapping]:
    """The Python frames of a recorded stack in the user's own code, innermost first (every Python frame when
    none is the user's)."""
    python = _python(frames)
    return [f for f in python if _mine(f)] or python


def frame_label(frames: Any) -> str:
    """The innermost user frame of a recorded stack as ``"function (file.py:line)"``; "" without Python frames."""
    for f in user_frames(frames)[:1]:
        return f"{f.get('name', '?')} ({os.path.basename(str(f['filename']))}:{f.get('line', 0)})"
    return ""
