#!/usr/bin/python3
"""Loads a dpactor checkpoint of the CNN (configs/cnn.cfg) into PyTorch.

    build/bin/dpactor --model configs/cnn.cfg --cpus 2 --epochs 5
    examples/load_in_pytorch.py checkpoints-cnn/latest --expect 0.9093

model.safetensors holds the module's parameters under its own state_dict
names and shapes, so the plain PyTorch module (the CNN class that made
configs/cnn.pt, in configs/cnn.py) takes them with load_state_dict(strict=True).
The script then evaluates the module on the Fashion-MNIST test set, scaled
as data.scale = "max" scales it (by the training set's largest value), and
prints the accuracy; with --expect it exits 1 unless it equals the accuracy
dpactor reported (to the 4 decimals dpactor prints: one test sample is 1e-4).

Needs python3-torch and python3-numpy (scripts/setup --bench); reads
safetensors by itself (the format is 8 bytes of header length, a JSON
header, then the raw tensors).
"""
import argparse
import gzip
import json
import os
import struct
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "configs"))
from cnn import CNN  # noqa: E402  the module cnn.pt was scripted from

DATA = "/usr/share/datasets/fashion-mnist"


def read_safetensors(path: str) -> dict:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        blob = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"{path}: tensor {name} is {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        values = np.frombuffer(blob[begin:end], dtype="<f4").reshape(info["shape"])
        tensors[name] = torch.from_numpy(values.copy())
    return tensors


def read_idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4 : 4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a checkpoint directory (or a root's 'latest')")
    p.add_argument("--expect", type=float, help="the test accuracy dpactor reported")
    args = p.parse_args()

    state = read_safetensors(os.path.join(args.checkpoint, "model.safetensors"))
    model = CNN()
    model.load_state_dict(state, strict=True)
    model.eval()

    train_max = float(read_idx(os.path.join(DATA, "train-images-idx3-ubyte.gz")).max())
    images = torch.from_numpy(read_idx(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")).astype(np.float32))
    labels = torch.from_numpy(read_idx(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")).astype(np.int64))
    x = (images * (1.0 / train_max)).reshape(-1, 1, 28, 28)
    with torch.no_grad():
        correct = int((model(x).argmax(1) == labels).sum())
    accuracy = correct / len(labels)
    print(f"loaded {len(state)} tensors with load_state_dict(strict=True); "
          f"test accuracy {accuracy:.4f} ({correct} of {len(labels)})")
    if args.expect is not None and abs(accuracy - args.expect) > 0.5e-4:
        sys.exit(f"dpactor reported {args.expect:.4f}; PyTorch measures {accuracy:.4f}")


if __name__ == "__main__":
    main()
