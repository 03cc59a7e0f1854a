"""Unit tests for tessera-opt's driver (tessera_compiler.opt / .driver): the
parts lit tests cannot easily check -- failing --verify-diagnostics runs,
split-input-file line numbers, robustness against garbage, and Python passes
inside a mixed pipeline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# In-process tests import tessera_compiler / tessera_passes / tessera_mlir from
# a checkout too (the subprocess tests get the same paths via PYTHONPATH).
for _p in (REPO_ROOT / "runtime", REPO_ROOT / "passes", REPO_ROOT,
           REPO_ROOT / "build" / "dev" / "python_packages"):
    if _p.is_dir() and str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


def _pythonpath() -> str:
    parts = [str(REPO_ROOT / "build" / "dev" / "python_packages"), str(REPO_ROOT),
             str(REPO_ROOT / "passes"), str(REPO_ROOT / "runtime")]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)


def run_opt(args, stdin: str | bytes | None = None, cwd: Path | None = None):
    """Runs `python -m tessera_compiler.opt` as a separate process."""
    env = dict(os.environ, PYTHONPATH=_pythonpath())
    env.pop("TESSERA_OPT_TRACEBACK", None)
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = subprocess.run([sys.executable, "-m", "tessera_compiler.opt", *map(str, args)],
                          input=data, capture_output=True, env=env, cwd=cwd, timeout=300)
    return proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


MATMUL_BAD = "  %0 = tgraph.matmul %a, %a : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>\n"


def bad_func(name: str, expected: str = "") -> str:
    return (f"func.func @{name}(%a: tensor<8x16xf32>) -> tensor<8x16xf32> {{\n"
            + (f"  {expected}\n" if expected else "")
            + MATMUL_BAD
            + "  return %0 : tensor<8x16xf32>\n}\n")


# ---------------------------------------------------------------------------
# --verify-diagnostics
# ---------------------------------------------------------------------------


def test_verify_diagnostics_passes_when_everything_matches(tmp_path):
    f = write(tmp_path, "ok.mlir", bad_func("f", "// expected-error @below {{contraction dimensions differ}}"))
    rc, out, err = run_opt([f, "--verify-diagnostics"])
    assert rc == 0, err
    assert err == ""


def test_verify_diagnostics_reports_missing_expected_error(tmp_path):
    text = ("func.func @f() {\n"
            "  // expected-error @below {{this error never happens}}\n"
            "  return\n"
            "}\n")
    f = write(tmp_path, "missing.mlir", text)
    rc, out, err = run_opt([f, "--verify-diagnostics"])
    assert rc == 1
    assert f'{f}:2:6: error: expected error "this error never happens" was not produced' in err
    assert "Traceback" not in err


def test_verify_diagnostics_reports_unexpected_error(tmp_path):
    f = write(tmp_path, "unexpected.mlir", bad_func("f"))
    rc, out, err = run_opt([f, "--verify-diagnostics"])
    assert rc == 1
    assert f"{f}:2:8: error: unexpected error: 'tgraph.matmul' op contraction dimensions differ" in err
    assert "Traceback" not in err


def test_verify_diagnostics_wrong_line_is_both_missing_and_unexpected(tmp_path):
    text = bad_func("f", "// expected-error @+2 {{contraction dimensions differ}}")
    f = write(tmp_path, "offset.mlir", text)
    rc, out, err = run_opt([f, "--verify-diagnostics"])
    assert rc == 1
    assert f"{f}:3:8: error: unexpected error:" in err
    assert f'{f}:2:6: error: expected error "contraction dimensions differ" was not produced' in err


def test_verify_diagnostics_one_chunk_failing_fails_the_run(tmp_path):
    text = (bad_func("good", "// expected-error @below {{contraction dimensions differ}}")
            + "// -----\n"
            + bad_func("bad", "// expected-error @below {{some other message}}"))
    f = write(tmp_path, "chunks.mlir", text)
    rc, out, err = run_opt([f, "--split-input-file", "--verify-diagnostics"])
    assert rc == 1
    # Line numbers are those of the whole file, not of the chunk.
    assert f'{f}:8:6: error: expected error "some other message" was not produced' in err
    assert f"{f}:9:8: error: unexpected error:" in err
    assert ":2:" not in err and ":3:" not in err


# verify_expected on its own, with hand-made diagnostics (warnings, remarks and
# notes cannot be produced from upstream ops alone).

from tessera_compiler.driver import Diag, parse_expected, verify_expected  # noqa: E402


def test_verify_expected_severities_and_designators():
    text = "\n".join([
        "op1  // expected-warning {{careful}}",          # 1
        "op2",                                           # 2
        "// expected-remark @above {{remark on op2}}",    # 3
        "// expected-note @-2 {{note on op2}}",           # 4
        "// expected-error @below {{error on op6}}",      # 5
        "op6",                                           # 6
        "// expected-error @unknown {{nowhere}}",         # 7
        "op8 // expected-error-re {{value {{[0-9]+}} too big}}",  # 8
    ])
    diags = [
        Diag("warning", "be careful here", "in.mlir", 1, 1),
        Diag("remark", "a remark on op2", "in.mlir", 2, 1,
             notes=[Diag("note", "a note on op2", "in.mlir", 2, 3)]),
        Diag("error", "an error on op6", "in.mlir", 6, 1),
        Diag("error", "nowhere to be found"),
        Diag("error", "value 42 too big", "in.mlir", 8, 1),
    ]
    assert verify_expected(text, diags, "in.mlir") == []


def test_verify_expected_near_miss_unexpected_and_missing():
    text = "op1 // expected-error {{boom}}\nop2\n// expected-note @above {{never}}\n"
    diags = [Diag("warning", "boom!", "in.mlir", 1, 1), Diag("error", "stray", "in.mlir", 2, 5)]
    problems = verify_expected(text, diags, "in.mlir")
    joined = "".join(problems)
    assert "in.mlir:1:8: error: 'warning' diagnostic emitted when expecting a 'error'" in joined
    assert "in.mlir:2:5: error: unexpected error: stray" in joined
    assert 'in.mlir:3:4: error: expected note "never" was not produced' in joined
    assert 'expected error "boom" was not produced' in joined
    assert len(problems) == 4


def test_verify_expected_other_file_is_unexpected():
    text = "op // expected-error {{boom}}\n"
    problems = verify_expected(text, [Diag("error", "boom", "other.mlir", 1, 1)], "in.mlir")
    assert any("unexpected error: boom" in p for p in problems)
    assert any("was not produced" in p for p in problems)


def test_parse_expected_dangling_below_and_bad_regex():
    expected, problems = parse_expected("// expected-error @below {{x}}\n")
    assert len(expected) == 1 and expected[0].line == 2  # the line after the last one
    expected, problems = parse_expected("// expected-error-re {{a{{[}}b}}\n")
    assert problems and "invalid regex" in problems[0][2]


# ---------------------------------------------------------------------------
# --split-input-file
# ---------------------------------------------------------------------------


def test_split_input_file_line_numbers_refer_to_original_file(tmp_path):
    text = ("// first chunk\n"               # 1
            "func.func @a() {\n"             # 2
            "  return\n"                     # 3
            "}\n"                            # 4
            "// -----\n"                     # 5
            "func.func @b() {\n"             # 6
            "  return\n"                     # 7
            "}\n"                            # 8
            "// -----   \n"                  # 9 (trailing blanks still split)
            "\n"                             # 10
            + bad_func("c"))                 # 11..14: the matmul is on line 12
    f = write(tmp_path, "split.mlir", text)
    rc, out, err = run_opt([f, "--split-input-file"])
    assert rc == 1
    assert err.startswith(f"{f}:12:8: error: 'tgraph.matmul' op contraction dimensions differ")
    # Outputs of the chunks, joined by the marker; the failed chunk prints nothing.
    parts = out.split("// -----\n")
    assert len(parts) == 3
    assert "func.func @a" in parts[0] and "func.func @b" in parts[1] and parts[2] == ""


def test_split_chunk_starting_with_code_keeps_line_numbers(tmp_path):
    # Several top-level ops and no comment line to hold the implicit module:
    # line numbers must still be right.
    text = ("func.func @a() {\n"
            "  return\n"
            "}\n"
            "// -----\n"
            "tgraph.mesh @m axes = [\"tp\"] shape = [2]\n"
            "func.func @b(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
            "  %0 = tgraph.all_reduce <sum> %x on @m[\"dp\"] : tensor<4xf32>\n"
            "  return %0 : tensor<4xf32>\n"
            "}\n")
    f = write(tmp_path, "code.mlir", text)
    rc, out, err = run_opt([f, "--split-input-file", "--mlir-print-debuginfo"])
    assert rc == 1
    assert err.startswith(f"{f}:7:8: error: 'tgraph.all_reduce' op mesh @m has no axis 'dp'")
    assert f'loc("{f}":2:3)' in out  # the `return` of @a


def test_columns_on_a_first_line_holding_several_ops():
    # Same positions as mlir-opt reports.
    rc, out, err = run_opt([], stdin="func.func @f() { return } func.func @f() { return }")
    assert rc == 1
    assert err.startswith("<stdin>:1:27: error: redefinition of symbol named 'f'")
    assert "<stdin>:1:1: note: see existing symbol definition here" in err
    rc, out, err = run_opt(["--mlir-print-debuginfo"],
                           stdin="func.func @f(%a: i32) { return } func.func @g() { return }")
    assert rc == 0, err
    assert 'loc("<stdin>":1:14)' in out and 'loc("<stdin>":1:34)' in out


def test_read_chunks_and_split_input(tmp_path):
    from tessera_compiler.driver import read_chunks, split_input

    f = write(tmp_path, "c.mlir", "a\n// -----\nb\nc\n// -----\n")
    chunks = read_chunks(str(f), True)
    assert [(c.first_line, c.body) for c in chunks] == [(1, "a\n"), (3, "b\nc\n"), (6, "")]
    assert chunks[1].text == "\n\nb\nc\n"
    assert [c.body for c in read_chunks(str(f), False)] == [f.read_text()]
    assert split_input("x\n// ------\ny") == [(1, "x\n// ------\ny")]  # not the marker


# ---------------------------------------------------------------------------
# Robustness: no tracebacks, clean errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("garbage", [
    "this is not MLIR at all",
    "func.func @f( {",
    "}}}}",
    "module { module {",
    "\"tgraph.matmul\"() : () -> ()",
    "tgraph.mesh @m axes = [\"tp\"] shape = [2\n",
    "func.func @f() { return } func.func @f() { return }",
    "!ttile.tile<>",
    "#tgraph.sharding<@m, [[1]]>",
])
def test_garbage_input_is_a_clean_error(garbage):
    rc, out, err = run_opt(["-"], stdin=garbage)
    assert rc == 1
    assert "<stdin>:" in err and "error:" in err
    assert "Traceback" not in err and "internal error" not in err


def test_binary_input_is_a_clean_error():
    rc, out, err = run_opt([], stdin=bytes(range(256)))
    assert rc == 1
    assert "error:" in err and "Traceback" not in err


def test_missing_input_file(tmp_path):
    rc, out, err = run_opt([tmp_path / "nope.mlir"])
    assert rc == 1
    assert "could not open input file" in err and "Traceback" not in err


def test_empty_input_gives_an_empty_module():
    rc, out, err = run_opt([], stdin="")
    assert rc == 0, err
    assert out.strip() == "module {\n}"


def test_too_many_inputs_and_unknown_options(tmp_path):
    rc, out, err = run_opt(["a.mlir", "b.mlir"])
    assert rc == 1 and "too many positional arguments" in err
    rc, out, err = run_opt(["--definitely-not-a-pass"], stdin="")
    assert rc == 1 and "unknown pass or option '--definitely-not-a-pass'" in err
    assert "Traceback" not in err


def test_output_file_written_only_on_success(tmp_path):
    good = write(tmp_path, "good.mlir", "func.func @f() {\n  return\n}\n")
    bad = write(tmp_path, "bad.mlir", bad_func("f"))
    out_file = tmp_path / "out.mlir"
    rc, out, err = run_opt([good, "-o", out_file])
    assert rc == 0 and out == "" and "func.func @f()" in out_file.read_text()
    out_file.unlink()
    rc, out, err = run_opt([bad, "-o", out_file])
    assert rc == 1 and not out_file.exists()


# ---------------------------------------------------------------------------
# Python passes inside a pipeline
# ---------------------------------------------------------------------------


@pytest.fixture
def register(monkeypatch):
    """Registers a throwaway pass: a real PassInfo whose load() returns a local
    function instead of importing a module, so the registry's add_to() runs."""
    import tessera_passes

    def add(flag, run, summary="a throwaway test pass"):
        info = tessera_passes.PassInfo(flag, "none", summary)
        # PassInfo is frozen; passes take (op, pass_, options), these ignore options.
        object.__setattr__(info, "load", lambda: lambda op, pass_, options: run(op, pass_))
        monkeypatch.setitem(tessera_passes.PASSES, flag, info)

    return add


PIPELINE_INPUT = """\
func.func @f(%a: i32) -> i32 {
  %c0 = arith.constant 0 : i32
  %0 = arith.addi %a, %a : i32
  %1 = arith.addi %a, %a : i32
  %2 = arith.addi %1, %c0 : i32
  %3 = arith.muli %0, %2 : i32
  return %3 : i32
}
"""


def _op_names(module_op):
    names = []
    for func in module_op.regions[0].blocks[0].operations:
        for op in func.regions[0].blocks[0].operations:
            names.append(op.operation.name)
    return names


def test_python_pass_runs_between_canonicalize_and_cse(tmp_path, register, capfd):
    from tessera_compiler import opt

    seen = []

    def record(op, pass_):
        assert op.name == "builtin.module"
        seen.append(_op_names(op))

    register("test-record", record)
    f = write(tmp_path, "p.mlir", PIPELINE_INPUT)
    rc = opt.main([str(f), "--pass-pipeline=builtin.module(test-record, canonicalize, test-record, "
                   "func.func(cse), test-record)", "--mlir-print-ir-after-all"])
    out, err = capfd.readouterr()
    assert rc == 0, err
    before, after_canon, after_cse = seen
    assert before.count("arith.constant") == 1 and before.count("arith.addi") == 3
    assert "arith.constant" not in after_canon and after_canon.count("arith.addi") == 2
    assert after_cse.count("arith.addi") == 1
    # IR printing names the Python pass like an upstream one.
    assert err.count("// -----// IR Dump After TestRecord (test-record) //----- //") == 3
    assert "IR Dump After Canonicalizer (canonicalize)" in err
    assert "IR Dump After CSE (cse)" in err
    assert out.count("arith.addi") == 1


def test_python_pass_by_flag_in_command_line_order(tmp_path, register, capfd):
    from tessera_compiler import opt

    seen = []
    register("test-record", lambda op, p: seen.append(_op_names(op)))
    f = write(tmp_path, "p.mlir", PIPELINE_INPUT)
    rc = opt.main([str(f), "--canonicalize", "--test-record", "--cse", "-test-record"])
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert [names.count("arith.addi") for names in seen] == [2, 1]


def test_python_pass_can_rewrite_the_ir(tmp_path, register, capfd):
    from tessera_compiler import opt

    def rename(op, pass_):
        from tessera_mlir import ir

        for func in op.regions[0].blocks[0].operations:
            func.operation.attributes["sym_name"] = ir.StringAttr.get("renamed")

    register("test-rename", rename)
    f = write(tmp_path, "p.mlir", PIPELINE_INPUT)
    rc = opt.main([str(f), "--test-rename", "--canonicalize"])
    out, err = capfd.readouterr()
    assert rc == 0, err
    assert "func.func @renamed(" in out


def test_failing_python_pass_reports_its_diagnostic(tmp_path, register, capfd):
    from tessera_compiler import opt

    def reject(op, pass_):
        func = op.regions[0].blocks[0].operations[0]
        func.location.emit_error("test pass rejects this function")
        pass_.signal_pass_failure()

    register("test-reject", reject)
    f = write(tmp_path, "p.mlir", PIPELINE_INPUT)
    rc = opt.main([str(f), "--canonicalize", "--test-reject"])
    out, err = capfd.readouterr()
    assert rc == 1
    assert f"{f}:1:1: error: test pass rejects this function" in err
    assert out == ""

    # The same failure, expected with --verify-diagnostics.
    g = write(tmp_path, "q.mlir", "// expected-error @below {{test pass rejects this function}}\n"
              + PIPELINE_INPUT)
    rc = opt.main([str(g), "--test-reject", "--verify-diagnostics"])
    out, err = capfd.readouterr()
    assert rc == 0, err


def test_dense_index_array_is_a_diagnostic_not_an_abort(tmp_path):
    """MLIR 22's parser aborts on `array<index: ...>` (an assertion, found
    by test/python/fuzz/test_fuzz_opt.py): tessera-opt refuses it first,
    naming the place, in another process so that an abort fails this test
    rather than ending the suite; a comment mentioning it is left alone."""
    import subprocess
    import sys
    f = write(tmp_path, "a.mlir", "// array<index: 1> in a comment is fine\n// -----\n"
              "func.func @f() attributes {x = array<index: 1>} {\n  return\n}\n")
    done = subprocess.run([sys.executable, "-m", "tessera_compiler.opt", str(f), "--split-input-file"],
                          capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert f"{f}:3:32: error: dense arrays of 'index' are not supported" in done.stderr, done.stderr
    assert done.stderr.count("error:") == 1, done.stderr


def test_python_pass_exception_is_a_diagnostic_not_a_traceback(tmp_path, register, capfd,
                                                              monkeypatch):
    from tessera_compiler import opt
    monkeypatch.delenv("TESSERA_OPT_TRACEBACK", raising=False)   # a developer's shell may set it

    def crash(op, pass_):
        raise RuntimeError("kaboom")

    register("test-crash", crash)
    f = write(tmp_path, "p.mlir", PIPELINE_INPUT)
    rc = opt.main([str(f), "--test-crash"])
    out, err = capfd.readouterr()
    assert rc == 1
    assert "error: pass 'test-crash' raised RuntimeError: kaboom" in err
    assert "Traceback" not in err


def test_python_pass_failing_silently_still_fails(tmp_path, register, capfd):
    from tessera_compiler import opt

    register("test-silent", lambda op, p: p.signal_pass_failure())
    f = write(tmp_path, "p.mlir", PIPELINE_INPUT)
    rc = opt.main([str(f), "--test-silent"])
    out, err = capfd.readouterr()
    assert rc == 1
    assert "error:" in err and "Traceback" not in err


def test_registered_pass_shows_in_help(register, capfd):
    from tessera_compiler import opt

    register("test-helpful", lambda op, p: None, summary="Does something helpful")
    assert opt.main(["--help"]) == 0
    out, _ = capfd.readouterr()
    assert "--test-helpful" in out and "Does something helpful" in out


def test_tessera_pass_options_rejected(register, capfd):
    from tessera_compiler import opt

    register("test-noopts", lambda op, p: None)
    rc = opt.main(["--pass-pipeline=builtin.module(test-noopts{x=1})"])
    _, err = capfd.readouterr()
    assert rc == 1 and "takes no options" in err


# ---------------------------------------------------------------------------
# Pipeline and flag parsing
# ---------------------------------------------------------------------------


def test_parse_pass_pipeline():
    from tessera_compiler.opt import UsageError, flag_to_element, parse_pass_pipeline

    els = parse_pass_pipeline("builtin.module(tessera-partition, canonicalize{max-iterations=3 "
                              "region-simplify=disabled}, func.func(cse, canonicalize))")
    assert [e.text for e in els] == ["tessera-partition",
                                     "canonicalize{max-iterations=3 region-simplify=disabled}",
                                     "func.func(cse, canonicalize)"]
    assert [e.text for e in parse_pass_pipeline("cse,canonicalize")] == ["cse", "canonicalize"]
    assert parse_pass_pipeline("builtin.module()") == []
    assert [e.text for e in parse_pass_pipeline('builtin.module(foo{s="a,b"})')] == ['foo{s="a,b"}']
    for bad in ["builtin.module(cse", "builtin.module(cse))", "cse,,canonicalize", "a{b"]:
        with pytest.raises(UsageError):
            parse_pass_pipeline(bad)
    assert flag_to_element("--canonicalize=max-iterations=3").text == "canonicalize{max-iterations=3}"
    assert flag_to_element("-cse").text == "cse"


def test_format_diagnostic():
    from tessera_compiler.driver import format_diagnostic

    d = Diag("error", "bad thing", "f.mlir", 2, 5, notes=[Diag("note", "see here", "f.mlir", 1, 1)])
    text = format_diagnostic(d, {"f.mlir": ["first line", "  x = bad"]})
    assert text == ("f.mlir:2:5: error: bad thing\n"
                    "  x = bad\n"
                    "    ^\n"
                    "f.mlir:1:1: note: see here\n"
                    "first line\n"
                    "^\n")
    assert format_diagnostic(Diag("warning", "w")) == "<unknown>:0: warning: w\n"
