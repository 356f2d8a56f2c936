"""The console ``trinity`` prints tables and progress on.

On a terminal rich fits output to the terminal's width (``COLUMNS`` when set). Anywhere else
(a pipe, a file, a CI log) rich assumes 80 columns and squeezes, wraps or cuts table columns
to fit: a task id or a metric name would come out cut. There nothing is cut: the width is
unlimited, and each row is as wide as its cells.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

# Wider than any row printed; not sys.maxsize, since rich sizes some buffers by the width.
UNLIMITED_WIDTH = 100_000


def output_console(**kwargs: Any) -> Console:
    """A rich ``Console`` (``kwargs`` as rich takes them) that never cuts a line when output
    is not a terminal."""
    console = Console(**kwargs)
    if not console.is_terminal:
        console.width = UNLIMITED_WIDTH
    return console
