#!/usr/bin/python3
"""PyTorch side of bench/compare_pytorch.py: trains the default MLP
(784-256-128-10, ReLU, cross-entropy, SGD momentum 0.9) on Fashion-MNIST, or
with --model cnn the CNN of configs/cnn.cfg (the nn.Module in configs/cnn.py,
eager), and prints one JSON line per batch size with the median step time.

    OPENBLAS_NUM_THREADS=N /usr/bin/python3 bench/pytorch_mlp.py single --batches 1,16,...
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/pytorch_mlp.py ddp --batches 16,...
    OPENBLAS_NUM_THREADS=2 /usr/bin/python3 bench/pytorch_mlp.py sgemm

Each step samples its batch from a per-epoch permutation, as dpactor does.
torch runs --threads intra-op threads (1 by default); OpenBLAS threads come
from the environment.
Denormals are flushed to zero, as in dpactor (torch.set_flush_denormal).
"""
import argparse
import gzip
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DATA = "/usr/share/datasets/fashion-mnist/"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "mlp"  # or "cnn" (--model)


def load():
    x = np.frombuffer(gzip.open(DATA + "train-images-idx3-ubyte.gz").read(), np.uint8, offset=16)
    y = np.frombuffer(gzip.open(DATA + "train-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)
    shape = (-1, 1, 28, 28) if MODEL == "cnn" else (-1, 784)
    return torch.from_numpy(x.reshape(shape).astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


def model():
    torch.manual_seed(0)
    if MODEL == "cnn":
        sys.path.insert(0, os.path.join(ROOT, "configs"))
        from cnn import CNN
        return CNN()
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10))


def plan(batch):
    """Steps per timing window (about 0.25 s) and the number of windows."""
    est = max(150e-6, batch * (300e-6 if MODEL == "cnn" else 12e-6))
    return max(3, int(0.25 / est)), 7  # the first window is warm-up


def time_steps(net, opt, x, y, batch, windows, per_window, before_window=None):
    n = x.shape[0]
    perm, pos = torch.randperm(n), 0
    times = []
    for w in range(windows):
        if before_window:
            before_window()
        t = time.perf_counter()
        for _ in range(per_window):
            if pos + batch > n:
                perm, pos = torch.randperm(n), 0
            idx = perm[pos:pos + batch]
            pos += batch
            loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
        times.append((time.perf_counter() - t) / per_window)
    return statistics.median(times[1:]) * 1e6, [t * 1e6 for t in times[1:]]


def single(batches):
    x, y = load()
    for b in batches:
        net = model()
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        per, windows = plan(b)
        med, all_ = time_steps(net, opt, x, y, b, windows, per)
        print(json.dumps({"batch": b, "step_us": med, "windows_us": all_}), flush=True)


def ddp_worker(rank, batches, port, queue, model_name):
    global MODEL
    MODEL = model_name
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x, y = load()
    for b in batches:
        local = b // 2
        net = torch.nn.parallel.DistributedDataParallel(model())
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        per, windows = plan(b)
        torch.manual_seed(rank + 1)  # each rank draws its own half of the batch
        med, all_ = time_steps(net, opt, x, y, local, windows, per, before_window=dist.barrier)
        if rank == 0:
            queue.put({"batch": b, "step_us": med, "windows_us": all_})
    dist.destroy_process_group()


def ddp(batches):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=ddp_worker, args=(r, batches, port, queue, MODEL)) for r in range(2)]
    for p in procs:
        p.start()
    for _ in batches:
        print(json.dumps(queue.get()), flush=True)
    for p in procs:
        p.join()


def sgemm():
    """Rate of the MLP's largest GEMM shape, (512, 784) x (784, 256)."""
    a, b = torch.rand(512, 784), torch.rand(784, 256)
    for _ in range(20):
        torch.mm(a, b)
    times = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(200):
            torch.mm(a, b)
        times.append((time.perf_counter() - t) / 200)
    flops = 2 * 512 * 784 * 256
    print(json.dumps({"sgemm_gflops": flops / statistics.median(times[1:]) / 1e9}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["single", "ddp", "sgemm"])
    p.add_argument("--batches", default="1,16,64,128,256,512,1024")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (single)")
    a = p.parse_args()
    global MODEL
    MODEL = a.model
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    batches = [int(b) for b in a.batches.split(",")]
    {"single": lambda: single(batches), "ddp": lambda: ddp([b for b in batches if b >= 2]), "sgemm": sgemm}[a.mode]()


if __name__ == "__main__":
    sys.exit(main())
