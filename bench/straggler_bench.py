#!/usr/bin/env python3
"""Straggler and fault benchmark for issue "stragglers, elasticity and fault
recovery" (acceptance B1-B4). Runs the dpactor program on configs/mlp.cfg,
several times per scenario, and prints medians and ratios.

    bench/straggler_bench.py [--dpactor build/bin/dpactor] [--repeats 3] [--epochs 2] [--full]

Throughput is the median over runs of the median epoch throughput (samples
per second of training, evaluation excluded). --full also trains the default
job to the end with each fault and reports the test accuracy (takes minutes).
Standard library only; no PyTorch needed.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(dpactor, args, epochs):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = [dpactor, "--model", os.path.join(ROOT, "configs/mlp.cfg"), "--quiet", "--metrics", metrics,
               "--set", 'train.checkpoint_dir=""'] + (["--epochs", str(epochs)] if epochs else []) + args
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
        records = [json.loads(line) for line in open(metrics)]
    return records, proc.stderr


def epoch_rate(records):
    return statistics.median(r["samples_per_s"] for r in records if r["event"] == "epoch")


def scenario(dpactor, args, repeats, epochs):
    rates, last = [], None
    for _ in range(repeats):
        records, _ = run(dpactor, args, epochs)
        rates.append(epoch_rate(records))
        last = records
    return statistics.median(rates), last


def summary(records):
    return next(r for r in records if r["event"] == "summary")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dpactor", default=os.path.join(ROOT, "build/bin/dpactor"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--full", action="store_true", help="also train the whole default job with each fault")
    a = p.parse_args()
    rows = []

    def add(name, args, note=""):
        rate, records = scenario(a.dpactor, args, a.repeats, a.epochs)
        rows.append((name, " ".join(args), rate, note))
        print(f"  {name}: {rate:,.0f} samples/s", file=sys.stderr)
        return rate, records

    print("B1: persistent straggler (slow:1:3)", file=sys.stderr)
    one, _ = add("one healthy device", ["--cpus", "1", "--set", "cluster.blas_threads=1"])
    ideal = one * (1 + 1 / 3)
    slow_none, _ = add("2 devices, slow:1:3, policy none", ["--cpus", "2", "--inject", "slow:1:3", "--set", "straggler.policy=none"])
    slow_bal, rec = add("2 devices, slow:1:3, balance+cut", ["--cpus", "2", "--inject", "slow:1:3"])
    shares = [r["shares"] for r in rec if r["event"] == "step"][-1]
    print("B2: transient straggler (jitter:0:0.1:20)", file=sys.stderr)
    clean_cut, _ = add("2 devices, no jitter, policy cut", ["--cpus", "2", "--set", "straggler.policy=cut"])
    jit_cut, rec_cut = add("2 devices, jitter:0:0.1:20, policy cut", ["--cpus", "2", "--inject", "jitter:0:0.1:20", "--set", "straggler.policy=cut"])
    jit_none, _ = add("2 devices, jitter:0:0.1:20, policy none", ["--cpus", "2", "--inject", "jitter:0:0.1:20", "--set", "straggler.policy=none"])

    print()
    print("| scenario | command-line flags | epoch samples/s (median) |")
    print("| --- | --- | --- |")
    for name, args, rate, _ in rows:
        print(f"| {name} | `{args}` | {rate:,.0f} |")
    print()
    print(f"B1: ideal = one device x (1 + 1/3) = {ideal:,.0f} samples/s")
    print(f"    balance+cut / ideal = {slow_bal / ideal:.3f} (target >= 0.85); none / ideal = {slow_none / ideal:.3f}; "
          f"none / one device = {slow_none / one:.3f} (expected about 0.67)")
    print(f"    final shares with balance: {', '.join(f'{s:.3f}' for s in shares)}")
    print(f"B2: jitter with cut / no jitter = {jit_cut / clean_cut:.3f} (target >= 0.9); "
          f"jitter with none / no jitter = {jit_none / clean_cut:.3f}; cuts in the cut run: {summary(rec_cut)['cuts']}")

    if a.full:
        print("\nFull default job (configs/mlp.cfg, all epochs):")
        print("| run | test accuracy | membership changes | max recovery ms | median step ms | cuts | requeued | note |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, args in [("slow:1:3, 2 devices", ["--cpus", "2", "--inject", "slow:1:3"]),
                           ("fail:1@200, 3 devices", ["--cpus", "3", "--inject", "fail:1@200"]),
                           ("hang:1@200, 3 devices", ["--cpus", "3", "--inject", "hang:1@200"]),
                           ("join:cpu@100 leave:0@300, 2 devices", ["--cpus", "2", "--inject", "join:cpu@100", "--inject", "leave:0@300",
                                                                   "--set", "train.verify_replicas=true"])]:
            records, stderr = run(a.dpactor, args, None)
            s = summary(records)
            steps = [r for r in records if r["event"] == "step"]
            step_ms = statistics.median(128 / r["samples_per_s"] * 1000 for r in steps[1:])
            note = ""
            m = re.search(r"no progress for ([0-9.]+) s \(hang timeout ([0-9.]+) s\)", stderr)
            if m:
                note = f"hang detected {1000 * (float(m.group(1)) - float(m.group(2))):.0f} ms after the timeout"
            members = [r for r in records if r["event"] == "membership"]
            note += "; " + " / ".join(f"gen {r['generation']} at step {r['step'] + 1}: {','.join(r['members'])}" for r in members[1:])
            print(f"| {name} | {s['test_accuracy']:.4f} | {s['membership_changes']} | {s['max_recovery_ms']:.1f} | {step_ms:.2f} | "
                  f"{s['cuts']} | {s['requeued']} | {note} |")


if __name__ == "__main__":
    main()
