#!/usr/bin/python3
"""Writes configs/cnn.pt, the small CNN of configs/cnn.cfg, as TorchScript.

Run with Debian's python3-torch (1.13, the libtorch dpactor's plugin runs):
    /usr/bin/python3 configs/cnn.py
A module for dpactor takes float32 samples shaped [N, *model.input_shape] and
returns class scores (logits) shaped [N, classes]; dpactor applies the loss.
Its initial weights are the ones saved here (seeded, so the file is
reproducible), the same on every replica.
"""
import os
import sys

import torch
from torch import nn


class CNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=5, padding=2)
        self.fc = nn.Linear(32 * 7 * 7, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "cnn.pt")
    torch.manual_seed(0)
    model = torch.jit.script(CNN())
    model.save(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{out}: {params} parameters, torch {torch.__version__}")


if __name__ == "__main__":
    main()
