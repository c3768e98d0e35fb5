#!/usr/bin/python3
"""How PyTorch DDP buckets the default MLP's gradients (issue 35, not a timed
test): DDP sends a bucket's all-reduce as soon as backward has produced every
gradient in it, so only a model of more than one bucket overlaps its exchange
with backward. Prints the bucket sizes DDP chose (its logging data) for the
model bench/pytorch_mlp.py trains, in a group of one process.

    scripts/setup --bench && bench/ddp_buckets.py
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_mlp import model  # noqa: E402


def main():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    net = torch.nn.parallel.DistributedDataParallel(model())
    x, y = torch.randn(128, 784), torch.randint(0, 10, (128,))
    for _ in range(2):  # DDP settles its buckets in the first iterations
        torch.nn.functional.cross_entropy(net(x), y).backward()
    info = net._get_ddp_logging_data()
    sizes = [int(s) for s in str(info.get("bucket_sizes")).split(",") if s.strip()]
    layers = [(name, p.numel() * p.element_size()) for name, p in net.module.named_parameters()]
    print(f"torch {torch.__version__}; bucket_cap_bytes {info.get('bucket_cap_bytes')}")
    print("parameters (bytes): " + ", ".join(f"{n} {b}" for n, b in layers) + f"; total {sum(b for _, b in layers)}")
    print(f"DDP's buckets (bytes): {sizes} ({len(sizes)} bucket{'s' if len(sizes) != 1 else ''})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
