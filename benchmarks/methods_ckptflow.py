"""ckptflow's methods: a synchronous save (`auto`, or forced compression), two async saves, a
delta after 10 AdamW steps (with the entropy floor beside it), a save after a fine-tune of the
top layers, a save without hashing, and the load."""

from __future__ import annotations

import time
import uuid

import numpy as np

from benchmarks import llm_state, probes


def ck_for(spec: dict, **kw):
    """A Checkpointer on the spec's path with its writer threads (and `kw`)."""
    from ckptflow.steps.checkpoint import Checkpointer

    return Checkpointer(spec["path"], threads=spec["threads"], **kw)


def compressed_share(manifest: dict) -> float | None:
    """The share of the raw bytes a save wrote (reused parts left out) that it stored
    compressed: what `compress="auto"` chose. None when it wrote nothing."""
    written = packed = 0
    for item in manifest["items"].values():
        for part in item["parts"]:
            if part.get("reused"):
                continue
            written += part["raw_size"]
            if part["planes"] != [["raw", part["raw_size"]]]:
                packed += part["raw_size"]
    return packed / written if written else None


def _ck_result(ck, step: int, stats, **extra) -> dict:
    m = ck.manifest(step)
    st = m["stats"]
    return {
        "save_s": stats.stall_s,  # a synchronous save: the caller waited for all of it
        "manifest": st,
        "compressed_share": compressed_share(m),
        "step": step,
        **extra,
    }


def save_ckptflow(spec: dict, sd: dict, **kw) -> dict:
    """A synchronous save with the defaults (`compress="auto"`), or with `kw` (compress=True:
    the codec's own ratio, what `auto` gives where storage is slow)."""
    ck = ck_for(spec, **kw)
    t0 = probes.clock()
    stats = ck.save(1, sd).wait()
    timed = probes.since(t0, "save")
    ck.close()
    return _ck_result(ck, 1, stats) | timed


def save_ckptflow_async(spec: dict, sd: dict, sd32: dict, names: list[str]) -> dict:
    """Two async saves; the second (after an AdamW step, staging buffers reused) is measured.
    Before the first, `prepare(state)` as the training loop calls it after its first step (the
    snapshot buffers are allocated and pre-faulted in the background while training goes on)."""
    ck = ck_for(spec)
    ck.prepare(sd)
    ck._stager.wait_prepared()  # as the training's next steps run meanwhile
    prepare_s = ck._stager.prepared_s
    t0 = time.perf_counter()
    first = ck.save(1, sd, block=False)
    first_stall = time.perf_counter() - t0
    first = first.wait()
    tr = llm_state.Trainer(sd32, names, lr=llm_state.LR_INCREMENTAL, seed=7)
    tr.step()
    sd = llm_state.as_dtype(sd32, spec["dtype"])
    t0 = time.perf_counter()
    handle = ck.save(2, sd, block=False)
    stall = time.perf_counter() - t0
    stats = handle.wait()
    total = time.perf_counter() - t0
    ck.close()
    out = _ck_result(ck, 2, stats, first_stall_s=first_stall, stall_wall_s=stall)
    out |= {"save_s": total, "stall_s": stall, "expect_state": sd, "prepare_s": prepare_s}
    return out


def save_ckptflow_nohash(spec: dict, sd: dict) -> dict:
    """The same save with xxh3 replaced by a unique id (benchmark-only monkeypatch).

    Also times xxh3 itself over the state's raw bytes and over the stored bytes of a normal save
    (the two digests a save computes), single-threaded, as a direct measure of hashing cost.
    """
    from ckptflow.core import codec

    hashed = save_ckptflow({**spec, "path": spec["path"] + "-hashed"}, sd)
    real = codec.digest
    codec.digest = lambda data: uuid.uuid4().hex
    try:
        ck = ck_for(spec)
        stats = ck.save(1, sd).wait()
        ck.close()
    finally:
        codec.digest = real
    t0 = time.perf_counter()
    for v in sd.values():
        real(llm_state.np_bytes(v))
    raw_hash_s = time.perf_counter() - t0
    stored = hashed["manifest"]["stored_bytes"]
    per_byte = raw_hash_s / max(llm_state.nbytes(sd), 1)
    return {
        "save_s": stats.stall_s,
        "stall_s": stats.stall_s,
        "save_s_hashed": hashed["save_s"],
        "hash_s_raw": raw_hash_s,
        "hash_s_total_est": raw_hash_s + per_byte * stored,
        "manifest": hashed["manifest"],
        "cleanup": [spec["path"] + "-hashed"],
        "no_load": True,
    }


def save_ckptflow_incremental(spec: dict, sd: dict, sd32: dict, names: list[str]) -> dict:
    """Full save, 10 AdamW steps at lr 1e-4, delta save (full_every=11): new bytes vs full."""
    ck = ck_for(spec, full_every=11)
    full = ck.save(0, sd).wait()
    before = {k: v.clone() for k, v in sd.items()}
    tr = llm_state.Trainer(sd32, names, lr=llm_state.LR_INCREMENTAL, seed=11)
    for _ in range(10):
        tr.step()
    sd = llm_state.as_dtype(sd32, spec["dtype"])
    t0 = probes.clock()
    delta = ck.save(10, sd).wait()
    timed = probes.since(t0, "save")
    ck.close()
    full_st = ck.manifest(0)["stats"]
    out = _ck_result(ck, 10, delta, expect_state=sd) | timed
    out["entropy_floor"] = entropy_floor(before, sd) / full_st["stored_bytes"]
    out |= {"full_save_s": full.stall_s, "full_manifest": full_st, "kind": delta.kind}
    out["ratio_vs_full"] = out["manifest"]["new_bytes"] / full_st["stored_bytes"]
    return out


def _h0_bytes(plane: np.ndarray) -> float:
    """Order-0 entropy of a byte plane, in bytes: what no coder of independent bytes beats."""
    counts = np.bincount(plane, minlength=256).astype(np.float64)
    p = counts[counts > 0] / len(plane)
    return float(-(p * np.log2(p)).sum()) * len(plane) / 8


def entropy_floor(base: dict, new: dict) -> float:
    """Bytes of a delta at the order-0 entropy floor (see entropy_floor_parts)."""
    return entropy_floor_parts(base, new)[0]


def entropy_floor_parts(base: dict, new: dict) -> tuple[float, float]:
    """(floor, the part of it in the two low mantissa planes of 4-byte floats) in bytes.

    Per tensor the cheapest of the transforms a delta part may store (the tensor itself, XOR
    against the base, the zigzag integer difference), each byte plane at its order-0 entropy:
    no coder of independent bytes goes below it. The low mantissa planes of a dense AdamW state
    are noise (entropy ~1.000): no lossless delta of it goes below their part."""
    from ckptflow.core import deltas

    total = low = 0.0
    for k, t in new.items():
        a, b = llm_state.np_bytes(t), llm_state.np_bytes(base[k])
        w = t.element_size() if t.is_floating_point() and t.numel() > 1 else 1
        kinds = [None, "xor"] + (["sub"] if w > 1 and deltas.sub_ok(w, len(a)) else [])
        best = None
        for kind in kinds:
            x = a if kind is None else deltas.delta(kind, a, b, w)
            planes = [_h0_bytes(np.ascontiguousarray(x[j::w])) for j in range(w)]
            if best is None or sum(planes) < sum(best):
                best = planes
        total += sum(best)
        low += best[0] + best[1] if w == 4 else 0.0
    return total, low


def save_ckptflow_frozen(spec: dict, sd: dict, sd32: dict, names: list[str]) -> dict:
    """Full save; train only the last tensors holding ~5% of the state; save again."""
    ck = ck_for(spec)
    ck.save(1, sd).wait()
    total, budget, trainable = llm_state.nbytes(sd32), 0, []
    for n in reversed(names):  # the last layers, like a fine-tune of the top of the model
        if budget >= 0.05 * total:
            break
        trainable.append(n)
        budget += 3 * sd32[f"model.{n}"].numel() * 4
    tr = llm_state.Trainer(sd32, names, lr=llm_state.LR_INCREMENTAL, seed=13)
    tr.step(only=trainable)
    sd = llm_state.as_dtype(sd32, spec["dtype"])
    stats = ck.save(2, sd).wait()
    ck.close()
    full_st = ck.manifest(1)["stats"]
    out = _ck_result(ck, 2, stats, expect_state=sd, changed_fraction=budget / total)
    out["full_manifest"] = full_st
    out["ratio_vs_full"] = out["manifest"]["new_bytes"] / full_st["stored_bytes"]
    return out


def load_ckptflow(spec: dict, expect: dict, dst) -> dict:
    ck = ck_for(spec)
    ck.load(dst, spec["step"])
    spec["_bytes_read"] = ck.last_load.bytes_read
    return dst


SAVERS = {
    "ckptflow-sync": save_ckptflow,
    "ckptflow-compressed": lambda spec, sd: save_ckptflow(spec, sd, compress=True),
    "ckptflow-coop2": save_ckptflow,
    "ckptflow-nohash": save_ckptflow_nohash,
}
TRAINING_SAVERS = {  # (spec, state, fp32 state, parameter names): they train between saves
    "ckptflow-async": save_ckptflow_async,
    "ckptflow-incremental": save_ckptflow_incremental,
    "ckptflow-frozen95": save_ckptflow_frozen,
}
LOADERS = {}  # every other ckptflow method loads with load_ckptflow (the default)
