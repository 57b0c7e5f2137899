"""A stand-in training script for the rendezvous test: all-reduce each rank's number once.

Run by torchrun exactly where the pretraining step would be; writes `<out>/rank<R>` with the
sum and world size it saw.
"""

import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    with open(os.path.join(out, f"rank{dist.get_rank()}"), "w") as fh:
        fh.write(f"{value.item():g} {dist.get_world_size()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
