#!/usr/bin/env python3
"""Start-up time of dpactor binaries, side by side.

    bench/startup.py --dpactor OLD=/path/to/old/dpactor --dpactor NEW=build/bin/dpactor

Runs `dpactor --help` (a process start with nothing else), a one-step CPU
job on synthetic data and a one-step default job (configs/mlp.cfg: reading
Fashion-MNIST is most of it), alternating the binaries, and prints each one's
median, minimum and maximum in milliseconds.
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

JOB = """
[model]
layers = [16, 8, 4]
[data]
format = "synthetic"
synthetic_train = 64
synthetic_test = 16
[train]
batch_size = 32
max_steps = 1
checkpoint_dir = ""
[cluster]
cpus = 1
"""


def timed(cmd):
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - start) * 1000.0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dpactor", action="append", required=True, help="NAME=PATH, once per binary")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    binaries = dict(item.split("=", 1) for item in args.dpactor)
    with tempfile.NamedTemporaryFile("w", suffix=".cfg") as job:
        job.write(JOB)
        job.flush()
        mlp = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs/mlp.cfg")
        cases = {"--help": ["--help"], "a one-step job": ["--model", job.name, "--gpus", "0"],
                 "the default job, one step": ["--model", mlp, "--gpus", "0", "--cpus", "1", "--set", "train.max_steps=1",
                                               "--set", "train.eval_every=0", "--set", "train.checkpoint_dir=\"\""]}
        times = {(name, case): [] for name in binaries for case in cases}
        for _ in range(args.runs):
            for case, extra in cases.items():
                for name, path in binaries.items():
                    times[(name, case)].append(timed([path, *extra]))
    for (name, case), values in times.items():
        print(f"{name:>12}  {case:<26} median {statistics.median(values):7.1f} ms"
              f"  min {min(values):7.1f}  max {max(values):7.1f}  ({len(values)} runs)")


if __name__ == "__main__":
    main()
