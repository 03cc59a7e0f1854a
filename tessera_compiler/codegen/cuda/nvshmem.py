"""NVSHMEM device calls: `ttile.my_pe`, `n_pes`, `put`, `get`, `signal`,
`wait`, `fence`, `quiet` (kernels that use them include nvshmem.h and are
device-linked with libnvshmem_device; see build.build_cuda_cubin).

Puts and gets are block-collective calls (every thread takes part); signals
and waits are issued by one thread between barriers, so the block's earlier
work is issued before a signal and nothing runs ahead of a wait."""

from __future__ import annotations

import math

from tessera_mlir import ir

from tessera_compiler.ir.types import ELEMENT_BYTES


class NvshmemOps:
    """The `op_ttile_*` printers of the NVSHMEM ops (a CudaKernelEmitter part)."""

    def _nvshmem(self) -> None:
        self.uses_nvshmem = True

    def op_ttile_my_pe(self, op):
        self._nvshmem()
        v = self.fresh("pe")
        self.line(f"const int64_t {v} = nvshmem_my_pe();")
        self.names[op.results[0]] = v

    def op_ttile_n_pes(self, op):
        self._nvshmem()
        v = self.fresh("npes")
        self.line(f"const int64_t {v} = nvshmem_n_pes();")
        self.names[op.results[0]] = v

    def _box_copy(self, op, call: str) -> None:
        """`call`(dest, source, bytes, pe) once per contiguous run of the box
        `op` (a ttile.put or ttile.get) copies: its rows, or larger runs where
        the box spans whole inner dimensions of both buffers (an exchange's
        piece is one call, not one per row)."""
        self._nvshmem()
        view = op.opview
        src, dst = self.names[view.source], self.names[view.dest]
        shape = list(ir.DenseI64ArrayAttr(op.attributes["shape"]))
        src_shape, dst_shape = self.buffers[src], self.buffers[dst]
        elt = ir.MemRefType(view.source.type).element_type
        nbytes = ELEMENT_BYTES[str(elt)]

        def base(buf_shape, offsets, ivs):
            lead = len(buf_shape) - len(shape)
            terms = []
            for d, o in enumerate(offsets):
                at = o if d < lead or d - lead >= len(ivs) else f"({o} + {ivs[d - lead]})"
                stride = math.prod(buf_shape[d + 1:])
                terms.append(at if stride == 1 else f"{at} * {stride}")
            return " + ".join(terms)
        # Box dimensions from `looped` on are one contiguous run in both
        # buffers: every one after the first spans its dimension whole.
        looped = len(shape) - 1
        while looped > 0 and all(shape[looped] == b[len(b) - len(shape) + looped]
                                 for b in (src_shape, dst_shape)):
            looped -= 1
        ivs = []
        for n in shape[:looped]:
            iv = self.fresh("r")
            ivs.append(iv)
            self.line(f"for (int64_t {iv} = 0; {iv} < {n}; ++{iv})")
        so = [self.scalar(v) for v in view.source_offsets]
        do = [self.scalar(v) for v in view.dest_offsets]
        run = math.prod(shape[looped:])                    # elements of one call
        size = f"{run * nbytes}"
        if view.rows is not None:
            # Only the box's first `rows` rows (of its last dimension): this
            # run's share of them, from its first row on.
            run_rows = run // shape[-1]
            first = " + ".join(f"{iv} * {math.prod(shape[d + 1:looped]) * run_rows}"
                               for d, iv in enumerate(ivs)) or "0"
            left = self.fresh("n")
            self.line(f"{{ const int64_t {left} = {self.scalar(view.rows)} - ({first});")
            size = f"({left} < {run_rows} ? {left} : {run_rows}) * {shape[-1] * nbytes}"
            self.line(f"  if ({left} > 0)")
        self.line(f"  {call}({dst} + {base(dst_shape, do, ivs)}, "
                  f"{src} + {base(src_shape, so, ivs)}, {size}, "
                  f"(int){self.scalar(view.pe)});")
        if view.rows is not None:
            self.line("}")

    def op_ttile_put(self, op):
        self._box_copy(op, "nvshmemx_putmem_nbi_block")

    def op_ttile_get(self, op):
        # Non-blocking gets of every row, then one quiet: the rows travel
        # together rather than one round trip each; the barrier makes what
        # each thread's share of the copy brought visible to the whole block.
        self._box_copy(op, "nvshmemx_getmem_nbi_block")
        self.line("nvshmem_quiet();")
        self.sync()

    def _signal_word(self, op) -> str:
        """The address of the signal word `op` names (`signals[index]`)."""
        self._nvshmem()
        view = op.opview
        return (f"reinterpret_cast<uint64_t*>({self.names[view.signals]}) + "
                f"{self.scalar(view.index)}")

    def op_ttile_signal(self, op):
        kind = {"set": "NVSHMEM_SIGNAL_SET", "add": "NVSHMEM_SIGNAL_ADD"}[
            ir.StringAttr(op.attributes["kind"]).value]
        view = op.opview
        self.sync()
        self.line(f"if (threadIdx.x == 0) nvshmemx_signal_op({self._signal_word(op)}, "
                  f"(uint64_t){self.scalar(view.value)}, {kind}, (int){self.scalar(view.pe)});")

    def op_ttile_wait(self, op):
        cmp = "NVSHMEM_CMP_" + ir.StringAttr(op.attributes["cmp"]).value.upper()
        self.line(f"if (threadIdx.x == 0) nvshmem_signal_wait_until({self._signal_word(op)}, "
                  f"{cmp}, (uint64_t){self.scalar(op.opview.value)});")
        self.sync()

    def op_ttile_fence(self, op):
        self._nvshmem()
        self.line("nvshmem_fence();")

    def op_ttile_quiet(self, op):
        self._nvshmem()
        self.line("nvshmem_quiet();")
        self.sync()
