"""Shared pieces of Tessera's mlir-opt-like command-line tools.

``tessera-opt`` (:mod:`tessera_compiler.opt`) and ``tessera-translate`` read
their input the same way (a file or stdin, optionally split into chunks at
``// -----`` lines), parse each chunk into a fresh MLIR context, collect the
diagnostics it produces and either print them (``file:line:col: error: ...``,
as mlir-opt does) or check them against ``// expected-error {{...}}``
directives (``--verify-diagnostics``).  Only what happens to a parsed module
differs between the tools, so this module offers:

* :func:`read_chunks` -- the input as :class:`Chunk` s whose text keeps the
  original file's line numbers;
* :class:`DiagnosticCollector` -- a context diagnostic handler turning every
  diagnostic into a plain :class:`Diag` (valid after the handler returns);
* :func:`parse_chunk` -- parse a chunk into a ``builtin.module`` (wrapping
  several top-level ops, or a single non-module op, in an implicit module as
  mlir-opt does);
* :func:`verify_expected` -- mlir-opt's ``--verify-diagnostics`` matching;
* :func:`format_diagnostic` -- mlir-opt's diagnostic rendering;
* :func:`process_chunks` -- the whole loop: per chunk, parse, hand the module
  to a callback, print or verify diagnostics, join the outputs.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

# When set, internal errors also print the Python traceback (tool developers
# only; users get a one-line error). Shared with the passes' own guard.
from tessera_passes import TRACEBACK_ENV
from tessera_runtime import env

DEFAULT_SPLIT_MARKER = "// -----"


class InputError(Exception):
    """The input could not be read (missing file, bad encoding...)."""


# ---------------------------------------------------------------------------
# Reading and splitting input
# ---------------------------------------------------------------------------


@dataclass
class Chunk:
    """One piece of the input, processed on its own.

    ``text`` is the chunk preceded by ``first_line - 1`` newlines, so that
    locations the parser assigns (and ``expected-*`` directive lines) are the
    original file's line numbers.
    """

    source_name: str
    first_line: int  # 1-based line of the original input where the chunk starts
    body: str  # the chunk's own text
    index: int = 0

    @property
    def text(self) -> str:
        return "\n" * (self.first_line - 1) + self.body


def read_input(path: Optional[str]) -> tuple[str, str]:
    """Returns ``(source_name, text)`` of ``path`` (``None`` or ``-``: stdin)."""
    if path is None or path == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
        name = "<stdin>"
    else:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise InputError(f"could not open input file '{path}': {e.strerror or e}") from None
        name = path
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"input '{name}' is not valid UTF-8 text: {e}") from None
    return name, data


def split_input(text: str, marker: str = DEFAULT_SPLIT_MARKER) -> list[tuple[int, str]]:
    """Splits ``text`` at lines that are exactly ``marker`` (trailing blanks
    allowed).  Returns ``(first_line, body)`` pairs; marker lines belong to no
    chunk."""
    lines = text.split("\n")
    chunks: list[tuple[int, str]] = []
    start = 0
    for i, line in enumerate(lines):
        if line.rstrip() == marker:
            chunks.append((start + 1, "\n".join(lines[start:i]) + "\n"))
            start = i + 1
    chunks.append((start + 1, "\n".join(lines[start:])))
    return chunks


def read_chunks(path: Optional[str], split: bool | str = False) -> list[Chunk]:
    """Reads ``path`` (or stdin) and splits it into chunks if ``split`` is true
    (``split`` may also be the marker string)."""
    name, text = read_input(path)
    return chunks_from_text(text, name, split)


def chunks_from_text(text: str, source_name: str, split: bool | str = False) -> list[Chunk]:
    if not split:
        return [Chunk(source_name, 1, text, 0)]
    marker = split if isinstance(split, str) else DEFAULT_SPLIT_MARKER
    return [Chunk(source_name, first, body, i)
            for i, (first, body) in enumerate(split_input(text, marker))]


# ---------------------------------------------------------------------------
# Diagnostics
# ---------------------------------------------------------------------------

_SEVERITY_NAMES = {"ERROR": "error", "WARNING": "warning", "NOTE": "note", "REMARK": "remark"}


def _severity_name(sev) -> str:
    name = getattr(sev, "name", None) or str(sev).rsplit(".", 1)[-1]
    return _SEVERITY_NAMES.get(name.upper(), name.lower())


def _file_location(loc, depth: int = 0):
    """The first file:line:col location inside ``loc`` (like
    ``Location::findInstanceOf<FileLineColLoc>``) as ``(file, line, col)``."""
    if loc is None or depth > 32:
        return None
    try:
        if loc.is_a_file():
            return loc.filename, loc.start_line, loc.start_col
        if loc.is_a_name():
            return _file_location(loc.child_loc, depth + 1)
        if loc.is_a_callsite():
            return _file_location(loc.callee, depth + 1) or _file_location(loc.caller, depth + 1)
        if loc.is_a_fused():
            for sub in loc.locations:
                found = _file_location(sub, depth + 1)
                if found:
                    return found
    except Exception:  # pragma: no cover - defensive: odd location kinds
        return None
    return None


@dataclass
class Diag:
    """A diagnostic, copied out of MLIR (``ir.Diagnostic`` objects are only
    valid inside the handler)."""

    severity: str  # "error" | "warning" | "note" | "remark"
    message: str
    filename: Optional[str] = None
    line: Optional[int] = None
    col: Optional[int] = None
    loc_str: str = "loc(unknown)"
    notes: list["Diag"] = field(default_factory=list)

    @classmethod
    def from_mlir(cls, d) -> "Diag":
        """From an ``ir.Diagnostic`` or ``ir.DiagnosticInfo``."""
        loc = d.location
        found = _file_location(loc)
        try:
            loc_str = str(loc)
        except Exception:  # pragma: no cover
            loc_str = "loc(unknown)"
        filename, line, col = found if found else (None, None, None)
        return cls(
            severity=_severity_name(d.severity),
            message=str(d.message),
            filename=filename,
            line=line,
            col=col,
            loc_str=loc_str,
            notes=[cls.from_mlir(n) for n in d.notes],
        )

    @property
    def has_file_location(self) -> bool:
        return self.filename is not None and self.line is not None

    def location_prefix(self) -> str:
        if self.has_file_location:
            return f"{self.filename}:{self.line}:{self.col}"
        if self.loc_str in ("loc(unknown)", ""):
            return "<unknown>:0"
        return self.loc_str

    def __str__(self) -> str:
        return f"{self.location_prefix()}: {self.severity}: {self.message}"


_OP_NOTE_PREFIX = "see current operation:"


def _is_op_note(note: Diag) -> bool:
    return note.severity == "note" and note.message.startswith(_OP_NOTE_PREFIX)


class DiagnosticCollector:
    """Collects every diagnostic emitted in ``context`` (errors included: it
    sets ``context.emit_error_diagnostics`` so that errors reach the handler
    rather than only the ``MLIRError`` the failing call raises).

    ``drop_op_notes`` drops the "see current operation: ..." notes MLIR
    attaches to op errors (mlir-opt does not produce them under
    ``--verify-diagnostics``).
    """

    def __init__(self, context, *, drop_op_notes: bool = False):
        self.context = context
        self.drop_op_notes = drop_op_notes
        self.diagnostics: list[Diag] = []
        context.emit_error_diagnostics = True
        self._handler = context.attach_diagnostic_handler(self._handle)

    def _handle(self, d) -> bool:
        try:
            self.add(Diag.from_mlir(d))
        except Exception as e:  # never let an exception escape into MLIR
            self.diagnostics.append(Diag("error", f"(could not read a diagnostic: {e})"))
        return True

    def add(self, diag: Diag) -> None:
        if self.drop_op_notes:
            diag.notes = [n for n in diag.notes if not _is_op_note(n)]
        self.diagnostics.append(diag)

    def add_mlir_error(self, exc) -> None:
        """Adds the diagnostics an ``ir.MLIRError`` carries, if any (normally
        none: the handler already saw them)."""
        for d in getattr(exc, "error_diagnostics", None) or []:
            try:
                self.add(Diag.from_mlir(d))
            except Exception:  # pragma: no cover
                pass

    def error(self, message: str, filename: Optional[str] = None,
              line: Optional[int] = None, col: Optional[int] = None) -> None:
        """Records an error the tool itself reports."""
        self.add(Diag("error", message, filename, line, col))

    @property
    def has_errors(self) -> bool:
        return any(d.severity == "error" for d in self.diagnostics)

    def take(self) -> list[Diag]:
        out, self.diagnostics = self.diagnostics, []
        return out

    def clear(self) -> None:
        self.diagnostics = []

    def detach(self) -> None:
        if self._handler is not None:
            try:
                self._handler.detach()
            except Exception:  # pragma: no cover
                pass
            self._handler = None

    def __enter__(self) -> "DiagnosticCollector":
        return self

    def __exit__(self, *exc) -> None:
        self.detach()


def _snippet(lines: Sequence[str], line: int, col: int, length: int = 1) -> str:
    """The source line and a caret under ``col`` (``^~~~`` for ``length``)."""
    if not (1 <= line <= len(lines)):
        return ""
    text = lines[line - 1].rstrip("\r")
    if not text.strip():
        return ""
    caret_col = max(col, 1)
    prefix = "".join(c if c == "\t" else " " for c in text[: caret_col - 1])
    return f"{text}\n{prefix}^{'~' * max(length - 1, 0)}\n"


def format_diagnostic(d: Diag, sources: Optional[dict[str, Sequence[str]]] = None, *,
                      notes: bool = True, severity: Optional[str] = None,
                      message: Optional[str] = None, snippet: bool = True) -> str:
    """Renders ``d`` like mlir-opt: ``file:line:col: error: message``, the
    source line and a caret when ``sources`` (filename -> lines) has the file,
    then the notes (a note at its diagnostic's own location shows no source
    line again).  Ends with a newline."""
    sev = severity or d.severity
    msg = message if message is not None else d.message
    out = f"{d.location_prefix()}: {sev}: {msg}\n"
    if snippet and sources and d.has_file_location and d.filename in sources:
        out += _snippet(sources[d.filename], d.line, d.col or 1)
    if notes:
        here = (d.filename, d.line, d.col)
        for n in d.notes:
            same = d.has_file_location and (n.filename, n.line, n.col) == here
            out += format_diagnostic(n, sources, snippet=not same)
    return out


# ---------------------------------------------------------------------------
# --verify-diagnostics
# ---------------------------------------------------------------------------

_EXPECTED_RE = re.compile(
    r"expected-(error|note|remark|warning)(-re)? *(@([+-][0-9]+|above|below|unknown))? *\{\{(.*)\}\}")


@dataclass
class ExpectedDiag:
    severity: str
    line: Optional[int]  # None: @unknown (a diagnostic without a file location)
    substring: str
    directive_line: int
    directive_col: int
    regex: Optional[re.Pattern] = None
    matched: bool = False

    def matches(self, message: str) -> bool:
        if self.regex is not None:
            return self.regex.search(message) is not None
        return self.substring in message


def _compile_expected_regex(text: str) -> re.Pattern:
    """``foo {{[0-9]+}} bar``: literal text with ``{{regex}}`` parts."""
    parts = []
    pos = 0
    while True:
        start = text.find("{{", pos)
        if start < 0:
            parts.append(re.escape(text[pos:]))
            break
        end = text.find("}}", start + 2)
        if end < 0:
            raise ValueError("found start of regex with no end '}}'")
        parts.append(re.escape(text[pos:start]))
        parts.append("(?:" + text[start + 2:end] + ")")
        pos = end + 2
    return re.compile("".join(parts))


def parse_expected(text: str) -> tuple[list[ExpectedDiag], list[tuple[int, int, str]]]:
    """The ``expected-*`` directives in ``text`` (line numbers as in ``text``),
    and ``(line, col, message)`` problems with malformed directives."""
    lines = text.split("\n")
    expected: list[ExpectedDiag] = []
    problems: list[tuple[int, int, str]] = []
    last_non_designator = 0  # 0-based index of the last line without a directive
    for_next_line: list[ExpectedDiag] = []
    for idx, raw in enumerate(lines):
        m = _EXPECTED_RE.search(raw.rstrip())
        if not m:
            for e in for_next_line:
                e.line = idx + 1
            for_next_line = []
            last_non_designator = idx
            continue
        kind, is_re, _, offset, body = m.groups()
        record = ExpectedDiag(kind, idx + 1, body, idx + 1, m.start() + 1)
        if is_re:
            try:
                record.regex = _compile_expected_regex(body)
            except (ValueError, re.error) as e:
                problems.append((idx + 1, m.start() + 1, f"invalid regex in expected-{kind}-re: {e}"))
                continue
        if offset:
            if offset[0] in "+-":
                delta = int(offset[1:])
                record.line = idx + 1 + (delta if offset[0] == "+" else -delta)
            elif offset == "unknown":
                record.line = None
            elif offset == "above":
                record.line = last_non_designator + 1
            else:  # below: the next line without a directive
                record.line = len(lines)
                for_next_line.append(record)
        expected.append(record)
    return expected, problems


def verify_expected(chunk_text: str, diagnostics: Iterable[Diag],
                    source_name: Optional[str] = None) -> list[str]:
    """Checks ``diagnostics`` against the ``expected-*`` directives of
    ``chunk_text`` the way mlir-opt's ``--verify-diagnostics`` does: each
    diagnostic (and each of its notes) must match a directive of the same
    kind on its line whose text is a substring of the message; each directive
    must match at least one diagnostic.

    Returns the failures as rendered error messages (empty: all matched).
    ``source_name``, if given, is the file the directives are in: diagnostics
    located in another file are unexpected.
    """
    expected, problems = parse_expected(chunk_text)
    name = source_name or "<input>"
    lines = chunk_text.split("\n")
    sources = {name: lines}
    failures: list[str] = [f"{name}:{line}:{col}: error: {msg}\n" + _snippet(lines, line, col)
                           for line, col, msg in problems]

    def check(d: Diag) -> None:
        in_file = d.has_file_location and (source_name is None or d.filename == source_name)
        near_miss = None
        for e in expected:
            if in_file:
                if e.line != d.line:
                    continue
            elif d.has_file_location or e.line is not None:
                continue
            if not e.matches(d.message):
                continue
            if e.severity == d.severity:
                e.matched = True
                return
            near_miss = e
        if near_miss is not None:
            loc = f"{name}:{near_miss.directive_line}:{near_miss.directive_col}"
            failures.append(f"{loc}: error: '{d.severity}' diagnostic emitted when expecting a "
                            f"'{near_miss.severity}'\n"
                            + _snippet(lines, near_miss.directive_line, near_miss.directive_col))
            return
        shown = Diag(d.severity, d.message, d.filename if d.filename else None, d.line, d.col, d.loc_str)
        if shown.has_file_location and source_name is None:
            shown.filename = name
        failures.append(format_diagnostic(shown, sources, severity="error",
                                          message=f"unexpected {d.severity}: {d.message}"))

    for d in diagnostics:
        check(d)
        for n in d.notes:
            check(n)

    for e in expected:
        if not e.matched:
            failures.append(
                f"{name}:{e.directive_line}:{e.directive_col}: error: expected {e.severity} "
                f"\"{e.substring}\" was not produced\n"
                + _snippet(lines, e.directive_line, e.directive_col, len(e.substring)))
    return failures


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------

# MLIR 22's parser aborts (an assertion) on a dense array of `index`
# (llvm/llvm-project#179045, fixed after 22.1): refused before it parses.
_INDEX_ARRAY_RE = re.compile(r"\barray<\s*index\b")
_SINGLE_OP_RE = re.compile(r"source must contain a single top-level operation, found: \d+")


_MODULE_OPEN = "module {"


def _wrap_in_module(chunk: Chunk) -> tuple[str, int]:
    """``chunk.text`` inside ``module { ... }``, the opening put at the start
    of line 1.  That line is normally padding, blank or a comment (a RUN
    line), so no location moves; when it holds code, its columns shift right:
    returns ``(text, shift)`` with that shift (0 normally), which the caller
    undoes on the parsed IR and the diagnostics."""
    lines = chunk.text.split("\n")
    first = lines[0].strip()
    shift = 0 if (not first or first.startswith("//")) else len(_MODULE_OPEN)
    lines[0] = _MODULE_OPEN + lines[0]
    return "\n".join(lines) + "\n}\n", shift


def _unshift_location(ir, loc, source_name: str, shift: int):
    """``loc`` moved back left by ``shift`` columns if it is on line 1 of
    ``source_name``, else ``None``."""
    try:
        if (loc.is_a_file() and loc.start_line == 1 and loc.filename == source_name
                and loc.start_col > shift):
            return ir.Location.file(source_name, 1, loc.start_col - shift, context=loc.context)
    except Exception:  # pragma: no cover - defensive
        return None
    return None


def _unshift_ir(ir, op, source_name: str, shift: int) -> None:
    """Moves every line-1 location in ``op`` back by ``shift`` columns."""

    def fix(o):
        o = o.operation
        new = _unshift_location(ir, o.location, source_name, shift)
        if new is not None:
            o.location = new
        for region in o.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    new = _unshift_location(ir, arg.location, source_name, shift)
                    if new is not None:
                        arg.set_location(new)
        return ir.WalkResult.ADVANCE

    op.walk(fix, ir.WalkOrder.PRE_ORDER)


def _unshift_diag(d: Diag, source_name: str, shift: int) -> None:
    if d.filename == source_name and d.line == 1 and d.col is not None and d.col > shift:
        d.col -= shift
    for n in d.notes:
        _unshift_diag(n, source_name, shift)


class ParsedModule:
    """A parsed ``builtin.module`` and whatever keeps it alive."""

    def __init__(self, operation, owner=None):
        self.operation = operation
        self._owner = owner


def parse_chunk(ir, context, chunk: Chunk, collector: DiagnosticCollector,
                *, verify: bool = True) -> Optional[ParsedModule]:
    """Parses ``chunk`` in ``context``; returns a ``builtin.module`` (wrapping
    the chunk's top-level ops in an implicit module unless it is a single
    module, like mlir-opt) or ``None`` after recording the errors in
    ``collector``."""
    with context:
        before = len(collector.diagnostics)
        for line, text in enumerate(chunk.text.split("\n"), 1):
            index_array = _INDEX_ARRAY_RE.search(text.split("//")[0])     # not in comments
            if index_array:
                collector.error("dense arrays of 'index' are not supported (their size is the "
                                "target's); use i64, e.g. array<i64: ...>", chunk.source_name,
                                line, index_array.start() + 1)
                return None
        try:
            op = ir.Operation.parse(chunk.text, source_name=chunk.source_name)
        except ir.MLIRError as e:
            collector.add_mlir_error(e)
            new = collector.diagnostics[before:]
            if not (len(new) == 1 and _SINGLE_OP_RE.search(new[0].message)):
                if len(collector.diagnostics) == before:
                    collector.error(f"could not parse input: {e.message}")
                return None
            # Zero or several top-level ops: parse them inside a module.
            del collector.diagnostics[before:]
            text, shift = _wrap_in_module(chunk)
            try:
                op = ir.Operation.parse(text, source_name=chunk.source_name)
            except ir.MLIRError as e2:
                collector.add_mlir_error(e2)
                if len(collector.diagnostics) == before:
                    collector.error(f"could not parse input: {e2.message}")
                return None
            finally:
                if shift:
                    for d in collector.diagnostics[before:]:
                        _unshift_diag(d, chunk.source_name, shift)
            op = op.operation
            if shift:
                _unshift_ir(ir, op, chunk.source_name, shift)
            op.location = ir.Location.file(chunk.source_name, 0, 0)
            return ParsedModule(op)
        op = op.operation
        if op.name == "builtin.module":
            return ParsedModule(op)
        # A single non-module op: put it in an implicit module.
        module = ir.Module.create(ir.Location.file(chunk.source_name, 0, 0))
        module.body.append(op)
        if verify:
            try:
                module.operation.verify()
            except ir.MLIRError as e:
                collector.add_mlir_error(e)
                if len(collector.diagnostics) == before:
                    collector.error(f"verification failed: {e.message}")
                return None
        return ParsedModule(module.operation, module)


# ---------------------------------------------------------------------------
# The per-chunk loop
# ---------------------------------------------------------------------------


@dataclass
class DriverOptions:
    split_input_file: bool | str = False
    verify_diagnostics: bool = False
    allow_unregistered_dialect: bool = False
    output_split_marker: str = DEFAULT_SPLIT_MARKER


#: ``process(module_op, chunk, context, collector) -> str | None``: the text
#: to print for this chunk, or ``None`` on failure (after recording errors).
ProcessFn = Callable[[object, Chunk, object, DiagnosticCollector], Optional[str]]


def internal_error_message(tool: str, exc: BaseException) -> str:
    msg = f"{tool}: internal error: {type(exc).__name__}: {exc}\n"
    if env.flag(TRACEBACK_ENV):
        msg += "".join(traceback.format_exception(exc))
    else:
        msg += f"{tool}: (set {TRACEBACK_ENV}=1 to see the Python traceback)\n"
    return msg


def process_chunks(chunks: Sequence[Chunk], process: ProcessFn, options: DriverOptions, *,
                   tool: str = "tessera", stderr=None) -> tuple[int, str]:
    """Parses and processes every chunk in a fresh context.  Prints
    diagnostics (or, with ``verify_diagnostics``, the verification failures)
    to ``stderr``.  Returns ``(exit_code, output_text)``."""
    from tessera_mlir import ir  # imported late: --help must not need it

    stderr = stderr or sys.stderr
    outputs: list[str] = []
    failed = False
    for chunk in chunks:
        context = ir.Context()
        context.allow_unregistered_dialects = options.allow_unregistered_dialect
        # Deterministic diagnostics, and Python callbacks stay on this thread.
        context.enable_multithreading(False)
        collector = DiagnosticCollector(context, drop_op_notes=options.verify_diagnostics)
        out: Optional[str] = None
        try:
            parsed = parse_chunk(ir, context, chunk, collector)
            if parsed is not None:
                with context:
                    try:
                        out = process(parsed.operation, chunk, context, collector)
                    except ir.MLIRError as e:
                        collector.add_mlir_error(e)
                        if not collector.has_errors:
                            collector.error(f"{e.message} (no error diagnostic was reported)",
                                            chunk.source_name, 0, 0)
                        out = None
                if out is None and not collector.has_errors:
                    collector.error(f"{tool} failed without reporting an error",
                                    chunk.source_name, 0, 0)
        except Exception as e:  # a bug in the tool or a pass: no traceback for users
            stderr.flush()
            stderr.write(internal_error_message(tool, e))
            failed = True
            out = None
        finally:
            diags = collector.take()
            collector.detach()

        sources = {chunk.source_name: chunk.text.split("\n")}
        if options.verify_diagnostics:
            problems = verify_expected(chunk.text, diags, chunk.source_name)
            for p in problems:
                stderr.write(p)
            if problems:
                failed = True
        else:
            for d in diags:
                stderr.write(format_diagnostic(d, sources))
            if out is None or any(d.severity == "error" for d in diags):
                failed = True
        outputs.append(out or "")
        stderr.flush()

    sep = options.output_split_marker + "\n"
    text = sep.join(outputs)
    return (1 if failed else 0), text


def write_output(text: str, path: Optional[str]) -> None:
    """Writes ``text`` to ``path`` (``None`` or ``-``: stdout)."""
    if path is None or path == "-":
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:  # e.g. `tessera-opt ... | head`
            try:
                sys.stdout = open(os.devnull, "w")
            except OSError:  # pragma: no cover
                pass
        return
    with open(path, "w") as f:
        f.write(text)
