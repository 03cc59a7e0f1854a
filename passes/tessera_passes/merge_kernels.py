"""tessera-merge-kernels: kernels identical but for their names become one.

Runs after tessera-lower-to-tile and canonicalize/cse (so that equal kernels
print alike). A Tile IR kernel (`ttile.kernel`) or library declaration
(`func.func` with `tsched.library`) whose text, without its name and
locations, equals an earlier one's is erased, and every `tsched.launch` of
it launches the earlier one instead. Why: a pipelined step is unrolled over
its microbatches, so each stage's kernels arrive once per microbatch (a
4-block GPT in 4 microbatches on 2 stages: 317 Tile IR kernels, 56
different), and every copy costs C++ (or nvcc) compile time and cache space.
"""

from __future__ import annotations

from tessera_mlir import ir

from tessera_compiler.ir.support import functions, ops_of, run_reporting


def _is_kernel(op: ir.Operation) -> bool:
    return op.name == "ttile.kernel" or (op.name == "func.func"
                                          and "tsched.library" in op.attributes)


def _text(kernel: ir.Operation, name: str) -> str:
    """The kernel as the merge compares it: printed on its own (local
    numbering, no locations), its name left out."""
    text = kernel.get_asm(enable_debug_info=False, use_local_scope=True, assume_verified=True)
    return text.replace(f"@{name}(", "@(", 1)


def merge_kernels(module: ir.Operation) -> int:
    """Merges the module's identical kernels; returns how many went."""
    block = module.regions[0].blocks[0]
    kept: dict = {}            # text -> name of the first kernel printing so
    renamed: dict = {}         # name -> the kept kernel's name
    doomed = []
    for op in [o.operation for o in block.operations]:
        if not _is_kernel(op):
            continue
        name = ir.StringAttr(op.attributes["sym_name"]).value
        first = kept.setdefault(_text(op, name), name)
        if first != name:
            renamed[name] = first
            doomed.append(op)
    if not renamed:
        return 0
    for f in functions(module):
        for launch in ops_of(f):
            if launch.name == "tsched.launch":
                name = ir.FlatSymbolRefAttr(launch.attributes["kernel"]).value
                if name in renamed:
                    launch.attributes["kernel"] = ir.FlatSymbolRefAttr.get(renamed[name])
    for op in doomed:
        op.erase()
    return len(doomed)


def run(op, pass_, options=None):
    run_reporting(op, pass_, lambda: merge_kernels(op))
