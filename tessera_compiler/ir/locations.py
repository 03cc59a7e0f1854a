"""Source locations: the Python line and parameter names the frontend
records in them."""

from __future__ import annotations

import re

from tessera_mlir import ir


def location_name(loc: ir.Location) -> str | None:
    """The name of a NameLoc (`loc("w1"(...))`), which the frontend uses to
    record Python parameter names; None for other locations."""
    m = re.match(r'loc\("([^"]+)"(?:\(|\)$)', str(loc))
    return m.group(1) if m else None


def source_of(loc: ir.Location) -> str:
    """`file.py:12` for a file location (possibly wrapped in a name), else ''."""
    text = str(loc)
    m = re.search(r'"([^"]+)":(\d+):\d+', text)
    return f"{m.group(1)}:{m.group(2)}" if m else ""
