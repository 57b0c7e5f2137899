"""ckptflow's benchmark methods: what they report is what the save did."""

import torch

from benchmarks import methods_ckptflow


def test_the_compressed_share_is_what_the_save_chose(tmp_path):
    from ckptflow.steps.checkpoint import Checkpointer

    sd = {"w": torch.randn(512, 1024), "b": torch.randn(16)}
    for compress, want in ((True, 1.0), (False, 0.0)):
        ck = Checkpointer(str(tmp_path / str(compress)), threads=2, compress=compress)
        ck.save(1, sd).wait()
        assert methods_ckptflow.compressed_share(ck.manifest(1)) == want
        ck.save(2, sd).wait()  # every part reused: nothing written, nothing chosen
        assert methods_ckptflow.compressed_share(ck.manifest(2)) is None
        ck.close()
