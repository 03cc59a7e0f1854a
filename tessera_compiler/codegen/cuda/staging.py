"""Tiles copied to shared memory ahead of use: `cp.async` copies, the
staged loop (a ring of `stages` slots, each iteration waiting for its own
copies and refilling the slot every warp finished with), and the tensor
memory accelerator (TMA boxes whose bytes complete on mbarriers)."""

from __future__ import annotations

import math

from tessera_mlir import ir


class Staging:
    """Shared-memory rings and their copies (a CudaKernelEmitter part). A
    ring's slots, stages and barrier offsets come from the IR
    (#ttile.pipeline, `ttile.ring`, `ttile.barriers`)."""

    def load_start(self, load) -> tuple[str, str, list[int]]:
        """(C name, flat element offset, shape) of the buffer a `ttile.load`
        reads, at its offsets."""
        buf = self.names[load.operands[0]]
        shape = self.buffers[buf]
        start = " + ".join(f"{self.scalar(v)} * {math.prod(shape[d + 1:])}"
                           for d, v in enumerate(list(load.operands)[1:]))
        return buf, start, shape

    def cp_async_tile(self, dst: str, load, rows: int, cols: int, ld: int | None) -> None:
        """Copies `load`'s rows x cols 16-bit tile to shared memory at `dst`
        in 16-byte cp.async chunks over the block: rows `ld` elements apart,
        or, with `ld` None, in wgmma's 128-byte swizzle (64-column panels of
        128-byte rows, chunk c of row r at chunk c ^ (r % 8); see
        `_wgmma_main_loop`)."""
        buf, start, shape = self.load_start(load)
        place = (f"((c >> 6) * {rows} + r) * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3)"
                 if ld is None else f"r * {ld} + c")
        self.line("#pragma unroll")
        self.line(f"for (int ch = threadIdx.x; ch < {rows * cols // 8}; ch += {self.threads}) {{")
        self.line(f"  const int r = ch / {cols // 8}, c = (ch % {cols // 8}) * 8;")
        self.line(f"  tessera_cp_async16({dst} + {place}, "
                  f"{buf} + {start} + (int64_t)r * {shape[-1]} + c);")
        self.line("}")

    def _trip_count(self, lb: str, ub: str, step: str) -> None:
        """Declares `n_it`, the iterations of a loop from `lb` to `ub` by `step`."""
        self.line(f"const int64_t n_it = {ub} > {lb} ? ({ub} - {lb} + {step} - 1) / {step} : 0;")

    def _at_iteration(self, iv: ir.Value, lb: str, step: str, it: str, emit) -> None:
        """Runs `emit()` with the loop variable `iv` bound to iteration
        `it`'s value (the C constant `kv`): the loads of a later iteration."""
        self.line(f"const int64_t kv = {lb} + ({it}) * {step};")
        saved = self.names.get(iv)
        self.names[iv] = "kv"
        emit()
        self.names[iv] = saved

    def staged_loop(self, iv: ir.Value, bounds, load, body, lag: int = 0,
                     ready: str | None = None, full: str | None = None) -> None:
        """An scf.for (induction variable `iv`, `bounds` lb/ub/step) whose
        loads stream through a ring of `stages` shared-memory slots:
        `load(slot)` emits the cp.async copies of one iteration (with `iv`
        bound to that iteration's value), `body(slot)` its computation (the
        C loop counter is `it`). `ahead` = stages - 1 - lag iterations'
        loads are in flight before the loop; each iteration waits for its
        own (then runs the `ready` statement, before the barrier), refills
        the slot every warp finished with, then computes; one commit group
        per iteration, even if empty. `lag` is how many iterations'
        computations may still be reading their slots when the next
        iteration starts (asynchronous wgmma groups left in flight): the slot
        refilled is the one read lag + 1 iterations ago. With nothing ahead,
        each iteration loads its own slot and ends with a barrier.

        With `full` (one mbarrier per slot, from mbarrier_ring) `load(slot)`
        issues TMA copies counted on `&full[slot]` (tma_copies): thread 0
        runs it, and each iteration waits on its slot's barrier phase
        instead of a cp.async group."""
        lb, ub, step = (self.scalar(v) for v in bounds)
        ahead = self.stages - 1 - lag
        assert ahead >= 0, "a pipeline needs more stages than computations in flight"

        def issue(slot: str, it: str) -> None:
            self.line("if (threadIdx.x == 0) {" if full else "{")
            self.indent += 1
            self._at_iteration(iv, lb, step, it, lambda: load(slot))
            self.indent -= 1
            self.line("}")
            if not full:
                self.line("tessera_cp_async_commit();")

        self._trip_count(lb, ub, step)
        for s in range(ahead):
            self.line(f"if ({s} < n_it)")
            issue(str(s), str(s))
        self.line("for (int64_t it = 0; it < n_it; ++it) {")
        self.indent += 1
        slot = "0" if self.stages == 1 else f"it % {self.stages}"
        if ahead == 0:
            issue(slot, "it")
        if full:
            self.line(f"tessera_mbarrier_wait(&{full}[{slot}], (unsigned)(it / {self.stages}) & 1);")
        else:
            self.line(f"tessera_cp_async_wait<{max(ahead - 1, 0)}>();")
        if ready:
            self.line(ready)
        self.line("__syncthreads();")
        if ahead:
            self.line(f"if (it + {ahead} < n_it)")
            issue(f"(it + {ahead}) % {self.stages}", f"it + {ahead}")
        body(slot)
        if ahead == 0:
            self.line("__syncthreads();")      # before the next iteration overwrites the slot
        self.indent -= 1
        self.line("}")
        if not full:
            self.line("tessera_cp_async_wait<0>();")
        self.line("__syncthreads();")


    def _tma_tile(self, dst: str, load, rows: int, cols: int, barrier: str) -> None:
        """Issues the TMA copies of `load`'s rows x cols tile to shared memory
        at `dst` (one thread): one box of `rows` x 64 columns per 64-column
        panel, each landing as `rows` 128-byte rows swizzled by the tensor
        map (CU_TENSOR_MAP_SWIZZLE_128B), the layout `cp_async_tile` writes
        for wgmma; completion is counted in bytes on `barrier`. The tensor map
        (the load's kernel argument, that box) is the runtime's job."""
        source = list(load.operands)[0]
        rank = len(ir.MemRefType(source.type).shape)
        spec = {"arg": ir.BlockArgument(source).arg_number, "box": [1] * (rank - 2) + [rows, 64]}
        if spec not in self.tensor_maps:
            self.tensor_maps.append(spec)
        tmap = f"tessera_tmaps + {128 * self.tensor_maps.index(spec)}"
        coords = [f"(int)({self.scalar(v)})" for v in reversed(list(load.operands)[1:])]
        for panel in range(cols // 64):
            inner = coords[0] if panel == 0 else f"(int)({self.scalar(list(load.operands)[-1])} + {64 * panel})"
            self.line(f"tessera_tma_load_{rank}d({dst} + {panel * rows * 64}, {tmap}, "
                      f"{', '.join([inner] + coords[1:])}, {barrier});")

    def mbarrier_ring(self, *barriers) -> list[str]:
        """One mbarrier per ring slot for each of `barriers` ((name, arrivals
        a phase)) at the loop's `ttile.barriers` offsets, initialized before
        a block barrier; returns their names."""
        names, inits = [], []
        for name, count in barriers:
            offset = self.barrier_offsets.pop(0)    # tessera-gpu-alloc-shared's
            self.line(f"uint64_t* const {name} = reinterpret_cast<uint64_t*>(tessera_smem + {offset});")
            names.append(name)
            inits.append(f"tessera_mbarrier_init(&{name}[s], {count});")
        self.line("if (threadIdx.x == 0) {")
        self.line(f"  for (int s = 0; s < {self.stages}; ++s) {{ {' '.join(inits)} }}")
        self.line("  tessera_fence_barrier_init();")
        self.line("}")
        self.line("__syncthreads();")
        return names

    def tma_copies(self, full: str, copies) -> None:
        """One thread's code: arms mbarrier `full` with the bytes of `copies`
        ((shared-memory destination, load, rows, cols) of 16-bit tiles) and
        issues them."""
        nbytes = sum(rows * cols * 2 for _, _, rows, cols in copies)
        self.line(f"tessera_mbarrier_expect_tx({full}, {nbytes});")
        for dst, load, rows, cols in copies:
            self._tma_tile(dst, load, rows, cols, full)
