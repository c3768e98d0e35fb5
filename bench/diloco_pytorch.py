#!/usr/bin/python3
"""DiLoCo in PyTorch beside dpactor's (issue 29, acceptance 6): the same
algorithm written independently in PyTorch eager, from the same initial
weights and the same data order, on the default job (Fashion-MNIST MLP,
global batch 128, 15 epochs), K = 4 logical workers, H = 16:

  - K copies of the model; in each round worker k takes its inner steps
    (torch.optim.SGD, momentum 0.9, its state kept across rounds) over its
    share of the round's H x 128 samples, in batches of 128 / K, at the
    cosine schedule's rate for each inner step (optimizer.lr / K);
  - the global weights move by the outer optimizer (torch.optim.SGD,
    Nesterov, lr 0.7, momentum 0.9) along the pseudo-gradient
    sum_k n_k (global - w_k) / sum_k n_k.

The initial weights are PyTorch's (nn.Linear's default init, torch seed 0),
written as a safetensors file that dpactor starts from (--init-from); the
data order is dpactor's (xoshiro256** seeded as tensors/rng.cpp,
Fisher-Yates), ported below. Prints both final test accuracies and their
difference.

    bench/diloco_pytorch.py [--dpactor build/bin/dpactor] [--epochs 15] [--every 16] [--workers 4]

Needs python3-torch and numpy; dpactor's side runs on 2 CPU replicas.
"""
import argparse
import gzip
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "/usr/share/datasets/fashion-mnist"
M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return x, z ^ (z >> 31)


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


class Rng:
    """tensors/rng.cpp: xoshiro256**, the (seed, stream) constructor."""

    def __init__(self, seed, stream):
        _, a = splitmix64(seed)
        x = a ^ ((stream * 0xD1342543DE82EF95 + 0x2545F4914F6CDD1D) & M64)
        self.s = []
        for _ in range(4):
            x, w = splitmix64(x)
            self.s.append(w)

    def next(self):
        s = self.s
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def below(self, n):
        m = self.next() * n
        low = m & M64
        if low < n:
            threshold = ((1 << 64) - n) % n
            while low < threshold:
                m = self.next() * n
                low = m & M64
        return m >> 64


def epoch_order(samples, seed, epoch):
    order = list(range(samples))
    gen = Rng(seed, epoch)
    for i in range(samples, 1, -1):
        j = gen.below(i)
        order[i - 1], order[j] = order[j], order[i - 1]
    return order


def idx(path):
    with gzip.open(path) as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load():
    xs = idx(f"{DATA}/train-images-idx3-ubyte.gz").reshape(60000, -1).astype(np.float32)
    scale = float(np.abs(xs).max())  # data.scale = "max", from the training set
    x = torch.from_numpy(xs / scale)
    y = torch.from_numpy(idx(f"{DATA}/train-labels-idx1-ubyte.gz").astype(np.int64))
    tx = torch.from_numpy(idx(f"{DATA}/t10k-images-idx3-ubyte.gz").reshape(10000, -1).astype(np.float32) / scale)
    ty = torch.from_numpy(idx(f"{DATA}/t10k-labels-idx1-ubyte.gz").astype(np.int64))
    return x, y, tx, ty


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10))


def save_safetensors(model, path):
    tensors = {k: v.detach().contiguous().numpy().astype("<f4") for k, v in model.state_dict().items()}
    header, offset, blobs = {}, 0, []
    for name, value in tensors.items():
        raw = value.tobytes()
        header[name] = {"dtype": "F32", "shape": list(value.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def cosine(base, t, total):
    return 0.5 * base * (1 + math.cos(math.pi * t / total))


def evaluate(model, tx, ty):
    with torch.no_grad():
        return (model(tx).argmax(1) == ty).float().mean().item()


def diloco(x, y, tx, ty, init, a):
    B, K, H = 128, a.workers, a.every
    b = B // K
    rows = x.shape[0]
    rounds_per_epoch = math.ceil(rows / (H * B))
    last = rows - (rounds_per_epoch - 1) * H * B
    inner_per_epoch = (rounds_per_epoch - 1) * H + math.ceil(math.ceil(last / K) / b)
    total_inner = inner_per_epoch * a.epochs
    base_lr = 0.1 / K  # optimizer.lr / K (sync.scale_inner_lr)
    global_model = mlp()
    global_model.load_state_dict(init.state_dict())
    outer = torch.optim.SGD(global_model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    workers = [mlp() for _ in range(K)]
    inner = [torch.optim.SGD(w.parameters(), lr=base_lr, momentum=0.9) for w in workers]
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(a.epochs):
        order = torch.tensor(epoch_order(rows, a.seed, epoch))
        for r in range(rounds_per_epoch):
            idx = order[r * H * B:(r + 1) * H * B]
            n = len(idx)
            share = math.ceil(n / K)
            position = epoch * inner_per_epoch + r * H
            pseudo = [torch.zeros_like(p) for p in global_model.parameters()]
            total = 0
            for k in range(K):
                mine = idx[k * share:(k + 1) * share]
                if len(mine) == 0:
                    continue
                with torch.no_grad():
                    for wp, gp in zip(workers[k].parameters(), global_model.parameters()):
                        wp.copy_(gp)
                for j, at in enumerate(range(0, len(mine), b)):
                    batch = mine[at:at + b]
                    for g in inner[k].param_groups:
                        g["lr"] = cosine(base_lr, position + j, total_inner)
                    inner[k].zero_grad()
                    loss_fn(workers[k](x[batch]), y[batch]).backward()
                    inner[k].step()
                with torch.no_grad():
                    for acc, wp, gp in zip(pseudo, workers[k].parameters(), global_model.parameters()):
                        acc += len(mine) * (gp - wp)
                total += len(mine)
            outer.zero_grad()
            for gp, acc in zip(global_model.parameters(), pseudo):
                gp.grad = acc / total
            outer.step()
        print(f"pytorch epoch {epoch + 1}: test accuracy {evaluate(global_model, tx, ty):.4f}", file=sys.stderr, flush=True)
    return evaluate(global_model, tx, ty)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dpactor", default=os.path.join(ROOT, "build/bin/dpactor"))
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--every", type=int, default=16)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--seed", type=int, default=42)
    a = p.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    init = mlp()
    x, y, tx, ty = load()
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "init.safetensors")
        save_safetensors(init, weights)
        cmd = [a.dpactor, "--model", os.path.join(ROOT, "configs/mlp.cfg"), "--cpus", "2", "--init-from", weights,
               "--set", 'train.checkpoint_dir=""', "--set", f"train.epochs={a.epochs}", "--set",
               f"train.seed={a.seed}", "--set", 'sync.mode="diloco"', "--set", f"sync.every={a.every}", "--set",
               f"sync.workers={a.workers}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"dpactor failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
        ours = float(re.search(r"test accuracy ([0-9.]+)", proc.stdout + proc.stderr).group(1))
    theirs = diloco(x, y, tx, ty, init, a)
    print(f"DiLoCo K = {a.workers}, H = {a.every}, {a.epochs} epochs, from PyTorch's initial weights (torch seed 0), "
          f"dpactor's data order (seed {a.seed})")
    print(f"| implementation | test accuracy |\n| --- | --- |\n| dpactor (2 CPU replicas) | {ours:.4f} |\n"
          f"| PyTorch eager | {theirs:.4f} |\n\ndifference: {100 * (ours - theirs):+.2f} points")


if __name__ == "__main__":
    main()
