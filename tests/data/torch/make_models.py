#!/usr/bin/python3
"""Writes the TorchScript files the torch tests use (tests/data/torch/*.pt).

Run with Debian's python3-torch (1.13): /usr/bin/python3 tests/data/torch/make_models.py
The tests use the committed files and never need Python.
  mlp_16_32_4.pt   nn.Sequential(Linear(16, 32), ReLU, Linear(32, 4)): the
                   torch twin of the tests' small MLP job (tests/test_support.cpp)
  float64.pt       the same with float64 parameters (refused)
  batchnorm.pt     with a BatchNorm1d, whose running statistics are buffers
  float64_buffer.pt  a float64 buffer beside float32 parameters (refused)
  flat_output.pt   forward returns one value per sample, shaped [N] (refused)
  state_dict.pt    torch.save of a state_dict: a zip archive, not TorchScript
  newer.pt         mlp_16_32_4.pt with its format version raised to 99, as a
                   future PyTorch would write (refused by 1.13)
"""
import os
import zipfile

import torch
from torch import nn

here = os.path.dirname(os.path.abspath(__file__))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


class Flat(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).squeeze(1)


class Float64Buffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)
        self.register_buffer("scale", torch.ones(4, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale.float()


def save(module: nn.Module, name: str) -> str:
    path = os.path.join(here, name)
    torch.jit.script(module).save(path)
    return path


def main() -> None:
    torch.manual_seed(1)
    base = save(mlp(), "mlp_16_32_4.pt")
    save(mlp().double(), "float64.pt")
    save(nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4)), "batchnorm.pt")
    save(Flat(), "flat_output.pt")
    save(Float64Buffer(), "float64_buffer.pt")
    torch.save(mlp().state_dict(), os.path.join(here, "state_dict.pt"))
    with zipfile.ZipFile(base) as src, zipfile.ZipFile(os.path.join(here, "newer.pt"), "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("/version"):
                data = b"99\n"
            dst.writestr(item, data)
    print("wrote", sorted(f for f in os.listdir(here) if f.endswith(".pt")), "with torch", torch.__version__)


if __name__ == "__main__":
    main()
