"""Differential fuzzing of misuse: random valid programs with one misuse
planted (misuse.py) must fail with a Tessera error at the planted line,
never return a value and never fail inside Tessera. A failure prints the
program as a script, as test_fuzz_programs does."""

import itertools
import re

from hypothesis import given, note

import misuse
import oracles

_names = itertools.count()


@oracles.fuzz_settings(examples=60)
@given(m=misuse.misused_programs())
def test_a_planted_misuse_fails_at_its_line_with_a_tessera_error(m, tmp_path_factory):
    import tessera as ts
    p = m.program
    arrays = p.draw_inputs(5)
    filename = str(tmp_path_factory.getbasetemp() / f"fuzz_misuse_{next(_names)}.py")
    shown = f"{m.kind}, planted at line {m.line}:\n{p.source(5)}"
    note(shown)
    try:
        got = oracles.run(p, arrays, filename)
    except ts.TesseraError as e:
        where = re.findall(rf"{re.escape(filename.split('/')[-1])}:(\d+)", str(e))
        assert str(m.line) in where, (f"{type(e).__name__} does not name the planted line "
                                      f"{m.line}: {e}\n--- {shown}")
        return
    except Exception as e:                       # noqa: BLE001 (what the test is about)
        raise AssertionError(f"not a Tessera error: {type(e).__name__}: {e}\n--- {shown}") \
            from None
    raise AssertionError(f"returned {got!r:.200} instead of failing\n--- {shown}")
