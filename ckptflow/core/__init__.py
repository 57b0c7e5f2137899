"""The checkpoint format core: a root's layout, manifests, listing, retention, GC and archive.

Torch-free and hera-free (fsspec, xxhash, zstandard and numpy only), so `ckptflow ckpt` and the
workflow side read checkpoint roots without the training stack.
"""
