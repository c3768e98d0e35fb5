#!/usr/bin/env python3
"""PyTorch eager on the GPU, beside bench/gpu_bench (scripts/gpu-check):
step time of the same MLPs, SGD momentum, fp32 (TF32 off), timed with CUDA
events. Prints one JSON line per case."""
import json
import statistics

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).cuda()


def bench(name, sizes, batch):
    net = mlp(sizes)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    rows = max(batch * 4, 16384)
    x = torch.rand(rows, sizes[0], device="cuda")
    y = torch.randint(0, sizes[-1], (rows,), device="cuda")

    def steps(n):
        for _ in range(n):
            idx = torch.randint(0, rows, (batch,), device="cuda")
            loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
            loss.item()  # the same per-step synchronisation as dpactor's step

    steps(20)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        steps(50)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 50 * 1000)
    print(json.dumps({"case": name, "batch": batch, "step_us": statistics.median(times)}), flush=True)


bench("mlp_784_256_128_10", [784, 256, 128, 10], 256)
bench("mlp_784_256_128_10", [784, 256, 128, 10], 4096)
bench("wide_4x4096", [784, 4096, 4096, 4096, 4096, 10], 4096)
