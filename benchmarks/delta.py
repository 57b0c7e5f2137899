"""Delta checkpoints after 10 AdamW steps (fp32): new bytes of a delta / a full save's bytes.

A script, not a test: `python benchmarks/delta.py [--mib 256] [--repeats 5]`. Each repeat
saves the LLM-shaped state of benchmarks/llm_state.py in full, runs 10 AdamW steps at
lr 1e-4 (fresh gradients per repeat), and saves a delta (`full_every=11`). It prints the median
ratio, the delta kind chosen per tensor group, and the entropy floor: the order-0 entropy of
each byte plane of the best transform (full, XOR or zigzag difference) per tensor, over the full
save's bytes; and the part of that floor the two low mantissa planes alone make (incompressible
noise in a dense AdamW state: no lossless delta goes below it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ckptflow.steps.checkpoint import Checkpointer  # noqa: E402

from benchmarks import llm_state, methods_ckptflow  # noqa: E402


def group(name: str) -> str:
    return "weights" if name.startswith("model.") else name.rsplit(".", 1)[1]


def repeat(sd32: dict, names: list[str], seed: int, work: str) -> dict:
    root = os.path.join(work, f"r{seed}")
    # both saves compressed: the full save is the codec's (auto may store it raw on a fast disk,
    # which would flatter the ratio)
    ck = Checkpointer(root, full_every=11, compress=True)
    sd = {k: v.clone() for k, v in sd32.items()}
    base = {k: v.clone() for k, v in sd.items()}
    t0 = time.process_time()
    ck.save(0, sd)
    full_cpu = time.process_time() - t0
    tr = llm_state.Trainer(sd, names, lr=llm_state.LR_INCREMENTAL, seed=seed)
    for _ in range(10):
        tr.step()
    sd = {k: v.detach() for k, v in sd.items()}
    t0 = time.process_time()
    ck.save(10, sd)
    delta_cpu = time.process_time() - t0
    ck.close()
    full, delta = ck.manifest(0), ck.manifest(10)
    kinds: dict = {}
    for it in delta["items"].values():
        for p in it["parts"]:
            kind = p.get("delta", "xor") if p["base"] is not None else "full"
            g = kinds.setdefault(group(it["fqn"]), {})
            g[kind] = g.get(kind, 0) + p["raw_size"]
    floor, low = methods_ckptflow.entropy_floor_parts(base, sd)
    fb = full["stats"]["stored_bytes"]
    out = {
        "ratio": delta["stats"]["new_bytes"] / fb,
        "floor": floor / fb,
        "floor_low_planes": low / fb,
        "full_raw": fb / full["stats"]["raw_bytes"],
        "full_cpu_s": full_cpu,
        "delta_cpu_s": delta_cpu,
        "kinds": kinds,
    }
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="fp32 state size (weights + moments)")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as work:
        info = llm_state.make_state(a.mib << 20, os.path.join(work, "state.safetensors"))
        sd32 = load_file(os.path.join(work, "state.safetensors"))
        rows = [repeat(sd32, info["names"], 100 + i, work) for i in range(a.repeats)]
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "kinds"}
    print(f"state {a.mib} MiB fp32, {a.repeats} repeats (medians)")
    print(f"full stored / raw            {med['full_raw']:.3f}")
    print(f"delta new bytes / full       {med['ratio']:.3f}   (target <= 0.84)")
    print(f"entropy floor / full         {med['floor']:.3f}   (order-0, best transform per tensor)")
    print(f"  of which low mantissa      {med['floor_low_planes']:.3f}")
    print(f"CPU-s full save / delta save {med['full_cpu_s']:.2f} / {med['delta_cpu_s']:.2f}")
    print("raw bytes per delta kind:", rows[0]["kinds"])
    print("ratios:", " ".join(f"{r['ratio']:.4f}" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
