"""``tessera-opt``: mlir-opt for Tessera.

Parses MLIR (Tessera's ``tgraph``/``tsched``/``ttile`` dialects and every
upstream dialect), runs a pass pipeline mixing Tessera's Python passes with
upstream MLIR passes, and prints the result::

    tessera-opt in.mlir --tessera-propagate-sharding --tessera-partition --canonicalize
    tessera-opt in.mlir --pass-pipeline='builtin.module(tessera-partition, canonicalize, func.func(cse))'
    tessera-opt errors.mlir --split-input-file --verify-diagnostics

Run ``tessera-opt --help`` for the options.
"""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Optional

from tessera_compiler import driver

TOOL = "tessera-opt"


class UsageError(Exception):
    """A bad command line or pass pipeline."""


# ---------------------------------------------------------------------------
# The Tessera pass registry
# ---------------------------------------------------------------------------


def tessera_passes() -> dict:
    """``flag -> PassInfo`` from ``tessera_passes`` (empty if unavailable)."""
    try:
        import tessera_passes
    except ImportError:
        return {}
    return dict(getattr(tessera_passes, "PASSES", {}))


# ---------------------------------------------------------------------------
# Pass pipelines
# ---------------------------------------------------------------------------


@dataclass
class PipelineElement:
    text: str  # a textual pipeline element: `cse`, `canonicalize{...}`, `func.func(cse)`
    origin: str  # how the user wrote it, for error messages
    from_flag: bool = False

    @property
    def name(self) -> str:
        m = re.match(r"[^{(\s]*", self.text)
        return m.group(0) if m else self.text

    @property
    def rest(self) -> str:
        return self.text[len(self.name):].strip()


_CLOSERS = {"(": ")", "{": "}", "[": "]"}


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Splits ``text`` at ``sep`` outside (), {}, [] and quotes."""
    parts: list[str] = []
    stack: list[str] = []
    quote: Optional[str] = None
    start = 0
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c in _CLOSERS:
            stack.append(_CLOSERS[c])
        elif c in ")}]":
            if not stack or stack[-1] != c:
                raise UsageError(f"unbalanced '{c}' at position {i + 1} of pass pipeline '{text}'")
            stack.pop()
        elif c == sep and not stack:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    if quote:
        raise UsageError(f"unterminated quote in pass pipeline '{text}'")
    if stack:
        raise UsageError(f"missing '{stack[-1]}' in pass pipeline '{text}'")
    parts.append(text[start:])
    return parts


def parse_pass_pipeline(text: str) -> list[PipelineElement]:
    """``builtin.module(a, b{opt=1}, func.func(c))`` -> its top-level elements.
    A bare list (``a, b``) is accepted too."""
    t = text.strip()
    m = re.match(r"(builtin\.module|any)\s*\(", t)
    if m:
        inner_start = m.end()
        # Is the parenthesis opened here the one closing at the very end?
        depth = 0
        close = None
        for i in range(inner_start - 1, len(t)):
            if t[i] == "(":
                depth += 1
            elif t[i] == ")":
                depth -= 1
                if depth == 0:
                    close = i
                    break
        if close is not None and t[close + 1:].strip() == "":
            t = t[inner_start:close]
    elements = []
    for part in split_top_level(t):
        part = part.strip()
        if not part:
            if t.strip():
                raise UsageError(f"empty element in pass pipeline '{text}'")
            continue
        elements.append(PipelineElement(part, part))
    return elements


def parse_pass_options(text: str, origin: str) -> dict[str, str | None]:
    """`{target=gpu wgmma=false}` -> {"target": "gpu", "wgmma": "false"}
    (MLIR's pass-option syntax: space-separated `name=value`, a value may
    hold commas, braces or quotes; a bare `name` (a boolean's true) maps to
    None)."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise UsageError(f"expected pass options in braces after the pass name in '{origin}'")
    values: dict[str, str] = {}
    for item in split_top_level(body[1:-1].replace("\t", " ").strip(), " "):
        item = item.strip()
        if not item:
            continue
        name, eq, value = item.partition("=")
        values[name.strip()] = value.strip().strip("'\"") if eq else None
    return values


def pass_options(info, el: PipelineElement, base):
    """The TargetOptions a Tessera pass runs with: `base` and the options
    the pipeline element gives it, which must be among those it declares."""
    if not el.rest:
        return base
    declared = {base.option_name(f) for f in getattr(info, "options", ())}
    if not declared:
        raise UsageError(f"Tessera pass '{el.name}' takes no options, got '{el.origin}'")
    given = parse_pass_options(el.rest, el.origin)
    unknown = [n for n in given if n not in declared]
    if unknown:
        known = ", ".join(sorted(declared)) or "none"
        raise UsageError(f"Tessera pass '{el.name}' has no option '{unknown[0]}' "
                         f"(its options: {known}; see '{TOOL} --help')")
    for name, value in given.items():
        if value is None:
            if base.field_of(name).type not in ("bool", bool):
                raise UsageError(f"pass option '{name}' in '{el.origin}' has no value "
                                 "(name=value)")
            given[name] = "true"
    try:
        return base.with_text(given)
    except ValueError as e:
        raise UsageError(f"invalid options for Tessera pass '{el.name}' in '{el.origin}': {e}") from None


def flag_to_element(flag: str) -> PipelineElement:
    """``--canonicalize=max-iterations=3`` -> ``canonicalize{max-iterations=3}``."""
    body = flag.lstrip("-")
    name, eq, opts = body.partition("=")
    text = f"{name}{{{opts}}}" if eq and opts else name
    return PipelineElement(text, flag, from_flag=True)


def build_pass_manager(elements: list[PipelineElement], context, opts: "Options"):
    """A ``builtin.module`` PassManager for ``elements`` in ``context``.
    Raises UsageError for unknown passes or bad options."""
    from tessera_mlir import passmanager

    from tessera_compiler.ir.options import TargetOptions

    registry = tessera_passes()
    pm = passmanager.PassManager("builtin.module", context=context)
    for el in elements:
        info = registry.get(el.name)
        if info is not None:
            options = pass_options(info, el, TargetOptions())
            try:
                info.add_to(pm, options)
            except Exception as e:  # noqa: BLE001
                raise UsageError(f"could not load Tessera pass '{el.name}': "
                                 f"{type(e).__name__}: {e}") from None
            continue
        try:
            pm.add(el.text)
        except ValueError as e:
            detail = str(e).strip()
            if "does not refer to a registered pass" in detail:
                if el.from_flag:
                    raise UsageError(f"unknown pass or option '{el.origin}' "
                                     f"(try '{TOOL} --help')") from None
                raise UsageError(f"unknown pass or option '{el.name}' in pass pipeline "
                                 f"(try '{TOOL} --help'):\n{detail}") from None
            raise UsageError(f"invalid pass '{el.origin}':\n{detail}") from None
    pm.enable_verifier(opts.verify_each)
    if opts.print_after_all or opts.print_before_all or opts.print_after_failure:
        pm.enable_ir_printing(
            print_before_all=opts.print_before_all,
            print_after_all=opts.print_after_all,
            print_module_scope=opts.print_module_scope,
            print_after_failure=opts.print_after_failure,
            large_elements_limit=opts.elide_elements_limit,
            enable_debug_info=opts.print_debuginfo,
            print_generic_op_form=opts.print_generic,
        )
    return pm


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


@dataclass
class Options:
    input: Optional[str] = None
    output: Optional[str] = None
    elements: list[PipelineElement] = field(default_factory=list)
    split_input_file: bool | str = False
    output_split_marker: str = driver.DEFAULT_SPLIT_MARKER
    verify_diagnostics: bool = False
    print_after_all: bool = False
    print_before_all: bool = False
    print_after_failure: bool = False
    print_module_scope: bool = False
    print_generic: bool = False
    print_debuginfo: bool = False
    elide_elements_limit: Optional[int] = None
    verify_each: bool = True
    allow_unregistered_dialect: bool = False
    help: bool = False
    list_passes: bool = False
    pass_table: bool = False


_OPTION_HELP = [
    ("<input file>", "input .mlir file; '-' or none reads stdin"),
    ("-o <filename>", "output file (default: stdout)"),
    ("--pass-pipeline=<pipeline>", "a textual pipeline, e.g. 'builtin.module(tessera-partition, "
                                   "canonicalize, func.func(cse))' (alias -p)"),
    ("--<pass>[=<options>]", "add one pass, in command-line order: a Tessera pass below or any "
                             "upstream MLIR pass (--canonicalize=max-iterations=3 becomes "
                             "canonicalize{max-iterations=3}; --tessera-lower-to-tile='target=gpu "
                             "wgmma=false' gives a Tessera pass its options)"),
    ("--split-input-file[=<marker>]", "process each '// -----'-separated chunk on its own; outputs "
                                      "are joined by '// -----'"),
    ("--output-split-marker=<marker>", "separator between the outputs of split chunks"),
    ("--verify-diagnostics", "check diagnostics against expected-error/warning/note/remark "
                             "{{...}} comments instead of printing them"),
    ("--mlir-print-ir-after-all", "print the IR after each pass (to stderr)"),
    ("--mlir-print-ir-before-all", "print the IR before each pass (to stderr)"),
    ("--mlir-print-ir-after-failure", "print the IR after a pass fails (to stderr)"),
    ("--mlir-print-ir-module-scope", "print the whole module when printing IR for nested passes"),
    ("--mlir-print-op-generic", "print operations in their generic form"),
    ("--mlir-print-debuginfo", "print locations"),
    ("--mlir-elide-elementsattrs-if-larger=<n>", "elide elements attributes with more than n elements"),
    ("--verify-each / --no-verify-each", "verify the IR after each pass (default: on)"),
    ("--allow-unregistered-dialect", "accept operations of unregistered dialects"),
    ("--mlir-disable-threading", "accepted for mlir-opt compatibility (always single-threaded)"),
    ("--list-passes", "list the Tessera passes"),
    ("--pass-table", "print the Tessera passes as a Markdown table (README.md's; "
                     "tools/readme_pass_table.py rewrites it there)"),
    ("-h, --help", "show this help"),
]


def help_text() -> str:
    lines = [
        f"OVERVIEW: {TOOL}: the Tessera optimizer driver (mlir-opt with Tessera's dialects and passes)",
        "",
        f"USAGE: {TOOL} [options] [<input file>]",
        "",
        "OPTIONS:",
    ]
    width = max(len(o) for o, _ in _OPTION_HELP) + 2
    for opt, desc in _OPTION_HELP:
        lines.append(f"  {opt:<{width}} {desc}")
    lines += ["", "Tessera passes:"]
    lines += _pass_lines()
    lines += [
        "",
        "Upstream MLIR passes: any pass name mlir-opt knows also works, as a flag",
        "(--canonicalize, --cse, --canonicalize=max-iterations=3) or as a --pass-pipeline",
        "element (canonicalize, func.func(cse), canonicalize{max-iterations=3}).",
        "",
    ]
    return "\n".join(lines)


def _pass_lines() -> list[str]:
    registry = tessera_passes()
    if not registry:
        return ["  (none: the tessera_passes package could not be imported)"]
    from tessera_compiler.ir.options import OPTION_FIELDS, TargetOptions

    defaults = TargetOptions()
    width = max(len(f) for f in registry) + 4
    lines = []
    for flag, info in registry.items():
        lines.append(f"  --{flag:<{width - 2}} - {getattr(info, 'summary', '')}")
        if getattr(info, "options", ()):
            lines.append(f"      options ({flag}{{name=value ...}}), with their defaults:")
        for name in getattr(info, "options", ()):
            option = TargetOptions.option_name(name)
            doc = OPTION_FIELDS[option].metadata["doc"]
            lines.append(f"        {option}={defaults.option_text(name)}")
            lines += textwrap.wrap(doc, 96, initial_indent=" " * 12, subsequent_indent=" " * 12)
    return lines


def pass_table() -> str:
    """The Tessera passes as a Markdown table (flag, summary, options), in
    registry order: README.md shows it, so that the README lists exactly the
    passes tessera-opt registers (test/test_readme_pass_table.py checks it)."""
    from tessera_compiler.ir.options import TargetOptions

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| flag | does | options |", "|---|---|---|"]
    for flag, info in tessera_passes().items():
        options = ", ".join(f"`{TargetOptions.option_name(o)}`" for o in info.options)
        lines.append(f"| `{flag}` | {cell(info.summary)} | {options} |")
    return "\n".join(lines) + "\n"


_BOOL_TRUE = {"", "true", "1", "on", "yes"}
_BOOL_FALSE = {"false", "0", "off", "no"}


def _bool(value: str, flag: str) -> bool:
    v = value.lower()
    if v in _BOOL_TRUE:
        return True
    if v in _BOOL_FALSE:
        return False
    raise UsageError(f"invalid value '{value}' for option '{flag}' (expected true or false)")


_SIMPLE_BOOLS = {
    "verify-diagnostics": "verify_diagnostics",
    "mlir-print-ir-after-all": "print_after_all",
    "mlir-print-ir-before-all": "print_before_all",
    "mlir-print-ir-after-failure": "print_after_failure",
    "mlir-print-ir-module-scope": "print_module_scope",
    "mlir-print-op-generic": "print_generic",
    "mlir-print-debuginfo": "print_debuginfo",
    "verify-each": "verify_each",
    "allow-unregistered-dialect": "allow_unregistered_dialect",
    "list-passes": "list_passes",
    "pass-table": "pass_table",
}

_IGNORED = {"mlir-disable-threading", "mlir-print-local-scope"}


def parse_args(argv: list[str]) -> Options:
    opts = Options()
    positional: list[str] = []
    i = 0
    only_positional = False

    def value_of(flag: str, inline: Optional[str]) -> str:
        nonlocal i
        if inline is not None:
            return inline
        if i + 1 >= len(argv):
            raise UsageError(f"option '{flag}' needs a value")
        i += 1
        return argv[i]

    while i < len(argv):
        arg = argv[i]
        if only_positional or arg == "-" or not arg.startswith("-"):
            positional.append(arg)
        elif arg == "--":
            only_positional = True
        else:
            body = arg.lstrip("-")
            name, eq, val = body.partition("=")
            inline = val if eq else None
            if name in ("h", "help", "help-hidden"):
                opts.help = True
            elif name == "o" or name == "output":
                opts.output = value_of(arg, inline)
            elif name in ("pass-pipeline", "p"):
                opts.elements.extend(parse_pass_pipeline(value_of(arg, inline)))
            elif name == "split-input-file":
                if inline is None or inline.lower() in _BOOL_TRUE:
                    opts.split_input_file = True
                elif inline.lower() in _BOOL_FALSE:
                    opts.split_input_file = False
                else:
                    opts.split_input_file = inline
            elif name == "output-split-marker":
                opts.output_split_marker = value_of(arg, inline)
            elif name == "no-verify-each":
                opts.verify_each = False
            elif name == "mlir-elide-elementsattrs-if-larger":
                v = value_of(arg, inline)
                try:
                    opts.elide_elements_limit = int(v)
                except ValueError:
                    raise UsageError(f"invalid value '{v}' for option '{arg}'") from None
            elif name in _SIMPLE_BOOLS:
                if name == "verify-diagnostics" and inline in ("all", "only-expected"):
                    inline = None
                setattr(opts, _SIMPLE_BOOLS[name], _bool(inline or "", arg))
            elif name in _IGNORED:
                pass
            elif not name or name.startswith("mlir-"):
                raise UsageError(f"unknown pass or option '{arg}' (try '{TOOL} --help')")
            else:
                opts.elements.append(flag_to_element(arg))
        i += 1

    if len(positional) > 1:
        raise UsageError(f"too many positional arguments: {' '.join(positional)} "
                         f"(expected one input file)")
    opts.input = positional[0] if positional else None
    return opts


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def _process_fn(opts: Options):
    def process(module_op, chunk, context, collector):
        if opts.elements:
            pm = build_pass_manager(opts.elements, context, opts)
            sys.stderr.flush()
            try:
                pm.run(module_op)
            finally:
                sys.stderr.flush()
        asm = module_op.get_asm(
            enable_debug_info=opts.print_debuginfo,
            print_generic_op_form=opts.print_generic,
            large_elements_limit=opts.elide_elements_limit,
        )
        return asm.rstrip("\n") + "\n\n"

    return process


def _validate_pipeline(opts: Options) -> None:
    """Builds the pass manager once up front, so that unknown passes are
    reported before (and without) reading any input."""
    if not opts.elements:
        return
    from tessera_mlir import ir

    build_pass_manager(opts.elements, ir.Context(), opts)


def run(argv: list[str]) -> int:
    try:
        opts = parse_args(argv)
    except UsageError as e:
        sys.stderr.write(f"{TOOL}: error: {e}\n")
        return 1
    if opts.help:
        sys.stdout.write(help_text())
        return 0
    if opts.list_passes:
        sys.stdout.write("Tessera passes:\n" + "\n".join(_pass_lines()) + "\n"
                         "(any upstream MLIR pass name also works)\n")
        return 0
    if opts.pass_table:
        sys.stdout.write(pass_table())
        return 0
    try:
        _validate_pipeline(opts)
    except UsageError as e:
        sys.stderr.write(f"{TOOL}: error: {e}\n")
        return 1
    try:
        chunks = driver.read_chunks(opts.input, opts.split_input_file)
    except driver.InputError as e:
        sys.stderr.write(f"{TOOL}: error: {e}\n")
        return 1
    options = driver.DriverOptions(
        split_input_file=opts.split_input_file,
        verify_diagnostics=opts.verify_diagnostics,
        allow_unregistered_dialect=opts.allow_unregistered_dialect,
        output_split_marker=opts.output_split_marker,
    )
    rc, text = driver.process_chunks(chunks, _process_fn(opts), options, tool=TOOL)
    if rc == 0 or opts.output in (None, "-"):
        try:
            driver.write_output(text, opts.output)
        except OSError as e:
            sys.stderr.write(f"{TOOL}: error: could not write output file '{opts.output}': "
                             f"{e.strerror or e}\n")
            return 1
    return rc


def main(argv: Optional[list[str]] = None) -> int:
    """The ``tessera-opt`` console script; returns the exit code."""
    if argv is None:
        argv = sys.argv[1:]
    try:
        return run(list(argv))
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - a bug: one line, not a traceback
        sys.stderr.write(driver.internal_error_message(TOOL, e))
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
