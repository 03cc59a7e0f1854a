"""Source locations: the Python line and parameter names the frontend
records in them."""

from __future__ import annotations

from tessera_mlir import ir


def location_name(loc: ir.Location) -> str | None:
    """The name of a NameLoc (`loc("w1"(...))`), which the frontend uses to
    record Python parameter names; None for other locations."""
    return loc.name_str if loc.is_a_name() else None


def source_of(loc: ir.Location) -> str:
    """`file.py:12` for the first file location in `loc` (itself, or inside
    a name, call site or fused location), else ''."""
    if loc.is_a_file():
        return f"{loc.filename}:{loc.start_line}"
    if loc.is_a_name():
        return source_of(loc.child_loc)
    if loc.is_a_callsite():
        return source_of(loc.callee) or source_of(loc.caller)
    if loc.is_a_fused():
        return next((s for s in map(source_of, loc.locations) if s), "")
    return ""
