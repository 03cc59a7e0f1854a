"""Peak memory of reading a Hugging Face checkpoint: whole on one process
(`models.from_pretrained(folder)`) against each rank's block on a tp mesh
(`models.from_pretrained(folder, mesh=)`: tp splits every projection,
pp holds each stage's layers on its ranks), on a Llama large enough that
the weights dominate.

    python bench/pretrained_rss.py --make /tmp/llama-rss        # writes the checkpoint
    python bench/pretrained_rss.py --load /tmp/llama-rss        # one process, whole
    tessera launch -n 2 bench/pretrained_rss.py --load /tmp/llama-rss --tp 2
    tessera launch -n 4 bench/pretrained_rss.py --load /tmp/llama-rss --tp 4
    tessera launch -n 2 bench/pretrained_rss.py --load /tmp/llama-rss --pp 2
    tessera launch -n 4 bench/pretrained_rss.py --load /tmp/llama-rss --pp 2 --tp 2

Each process prints its peak resident set (ru_maxrss) after the read, the
peak before it (Python, numpy, Tessera imported: the baseline), their
difference, its anonymous and file-backed resident memory after the read
(safetensors maps the file: pages it touched count in RSS as page cache,
shared between the ranks of a node), and the bytes of weights it holds.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

import numpy as np


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def resident_mib() -> dict:
    """Now: the process's own memory (RssAnon) and the file pages it maps
    (RssFile: the page cache of the safetensors file, shared and
    reclaimable), in MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines()
                  if line.startswith(("RssAnon", "RssFile")))
    return {k: int(v.split()[0]) / 1024 for k, v in fields.items()}


def make(folder: Path, width: int, depth: int, vocab: int) -> None:
    from safetensors.numpy import save_file

    from tessera.pretrained import LlamaConfig
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
              "hidden_size": width, "intermediate_size": -(-width * 8 // 3 // 256) * 256,
              "num_hidden_layers": depth, "num_attention_heads": width // 64,
              "num_key_value_heads": width // 256, "max_position_embeddings": 2048,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
              "tie_word_embeddings": False}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shapes = LlamaConfig.from_json(config, str(folder)).parameter_shapes()
    rng = np.random.default_rng(0)
    weights = {n: (rng.standard_normal(s, np.float32) * 0.02) for n, s in shapes.items()}
    save_file(weights, str(folder / "model.safetensors"))
    total = sum(w.nbytes for w in weights.values())
    print(f"wrote {folder}: {len(weights)} tensors, {total / 2**20:.0f} MiB")


def load(folder: Path, tp: int, pp: int) -> None:
    import tessera as ts
    from tessera import dist, models
    mesh = None
    if tp * pp > 1:
        mesh = dist.Mesh(axes=["pp", "tp"], shape=(pp, tp))
        mesh.require_rank(f"--pp {pp} --tp {tp}")
    before = peak_mib()
    m = models.from_pretrained(folder, mesh=mesh)
    after = peak_mib()
    held = sum(p.nbytes for p in m.params.values())     # (a DTensor's: this rank's block)
    rank = mesh.rank if mesh else 0
    now = resident_mib()
    print(f"rank {rank} of {tp * pp} (pp {pp}, tp {tp}): peak RSS {after:.0f} MiB (baseline {before:.0f} MiB: +"
          f"{after - before:.0f} MiB); after the read: anonymous {now['RssAnon']:.0f} MiB, file "
          f"pages {now['RssFile']:.0f} MiB; weights held {held / 2**20:.0f} MiB", flush=True)
    del ts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--make", type=Path, default=None)
    ap.add_argument("--load", type=Path, default=None)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args()
    if args.make:
        make(args.make, args.width, args.depth, args.vocab)
    if args.load:
        load(args.load, args.tp, args.pp)
    if not (args.make or args.load):
        ap.error("--make DIR and/or --load DIR")


if __name__ == "__main__":
    sys.exit(main())
