#!/usr/bin/env python3
"""What reproducible mode (train.reproducible) costs and what its straggler
handling buys, measured side by side in one run on this machine.

  1. The default job (Fashion-MNIST MLP, global batch 128, 2 CPU replicas)
     with train.reproducible on and off, alternated --pairs times.
  2. Global batch 1024 on 2 replicas, one 3x slower (--inject slow:1:3), in
     reproducible mode: balanced slices with stealing (straggler.policy
     "balance+cut") against an even split with no stealing ("none"); the
     ideal ratio is 2.0.
  3. The same with jitter (--inject jitter:1:0.5:5: half the steps of replica
     1 take 5 ms longer): stealing ("cut", "balance+cut") against waiting
     ("none", "balance").

Each figure is the median samples/s over windows of --window steps after a
warm-up window, read from the metrics file; each configuration runs --pairs
times, alternated with the others, and the table gives the median of those
medians. Nothing here is a test: timings on a shared machine move.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(dpactor, batch, window, windows, sets, inject=()):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = [dpactor, "--model", os.path.join(ROOT, "configs/mlp.cfg"), "--quiet", "--cpus", "2",
               "--batch-size", str(batch), "--metrics", metrics, "--epochs", "100000",
               "--set", f"train.max_steps={window * windows}", "--set", f"train.log_every={window}",
               "--set", "train.eval_every=0", "--set", 'train.checkpoint_dir=""']
        for s in sets:
            cmd += ["--set", s]
        for i in inject:
            cmd += ["--inject", i]
        subprocess.run(cmd, check=True, capture_output=True)
        rates = [json.loads(l)["samples_per_s"] for l in open(metrics) if '"event":"step"' in l]
    return statistics.median(rates[1:])  # the first window is warm-up


def compare(dpactor, title, configs, batch, window, windows, pairs):
    results = {name: [] for name, _, _ in configs}
    for p in range(pairs):
        for name, sets, inject in configs:
            print(f"{title}: {name}, run {p + 1}/{pairs} ...", file=sys.stderr)
            results[name].append(run(dpactor, batch, window, windows, sets, inject))
    print(f"\n{title} (global batch {batch}, 2 CPU replicas, {pairs} runs each)\n")
    print("| configuration | median samples/s | runs |")
    print("| --- | ---: | --- |")
    medians = {}
    for name, _, _ in configs:
        medians[name] = statistics.median(results[name])
        runs = " ".join(f"{r:,.0f}" for r in results[name])
        print(f"| {name} | {medians[name]:,.0f} | {runs} |")
    return medians


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dpactor", default=os.path.join(ROOT, "build/bin/dpactor"))
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--only", choices=("modes", "slow", "jitter"), help="run one part only")
    a = p.parse_args()

    if a.only in (None, "modes"):
        m = compare(a.dpactor, "Reproducible mode against the faster paths",
                    [("train.reproducible = true", ["train.reproducible=true"], ()),
                     ("train.reproducible = false", ["train.reproducible=false"], ())],
                    batch=128, window=300, windows=7, pairs=a.pairs)
        print(f"\nreproducible / fast: {m['train.reproducible = true'] / m['train.reproducible = false']:.2f}")

    if a.only in (None, "slow"):
        slow = ["slow:1:3"]
        m = compare(a.dpactor, "One replica 3x slower, reproducible mode",
                    [("even split, no stealing (policy none)", ["straggler.policy=none"], slow),
                     ("balanced, stealing (policy balance+cut)", ["straggler.policy=balance+cut"], slow)],
                    batch=1024, window=40, windows=7, pairs=a.pairs)
        ratio = m["balanced, stealing (policy balance+cut)"] / m["even split, no stealing (policy none)"]
        print(f"\nbalanced with stealing / even split without: {ratio:.2f} (ideal 2.0)")

    if a.only in (None, "jitter"):
        jitter = ["jitter:1:0.5:5"]
        compare(a.dpactor, "Replica 1 takes 5 ms longer in half the steps, reproducible mode",
                [("waiting (policy none)", ["straggler.policy=none"], jitter),
                 ("waiting, balanced (policy balance)", ["straggler.policy=balance"], jitter),
                 ("stealing (policy cut)", ["straggler.policy=cut"], jitter),
                 ("stealing, balanced (policy balance+cut)", ["straggler.policy=balance+cut"], jitter)],
                batch=1024, window=40, windows=7, pairs=a.pairs)


if __name__ == "__main__":
    main()
