#!/usr/bin/env python3
"""Low-communication rounds (issue "local SGD, DiLoCo ...", acceptance 1):
the default job (Fashion-MNIST MLP, 15 epochs) on 2 CPU replicas with
K = 4 logical workers, every_step against diloco at H = 4, 8, 16 and 64 and
local_sgd at H = 16, diloco with the int8 codec at H = 16 and 64, and streaming
diloco (4 fragments) at H = 16, and diloco at H = 16 with the one-round
delay (sync.delay = 1), in fp32 and int8, and every_step with its gradients in
bf16 (sync.codec = "bf16", issue "Never wait for the slowest") and as PowerSGD's
factors (sync.codec = "powersgd", rank 4 and 1, from step 1000, 100 and 0): final test accuracy (median over 3 seeds: a reproducible
run gives the same bytes every time, so the spread is the seed's) and the
bytes the collectives sent (the summary's, See Note [Bytes sent]). Writes the
table to stdout and the accuracy-against-bytes curves (seed 42) as an SVG.

    bench/rounds_bench.py [--dpactor build/bin/dpactor] [--seeds 42,43,44] [--epochs 15] [--svg docs/perf/rounds.svg]
                          [--only "diloco H=16,diloco H=16 P=4"] [--set straggler.policy=\"none\"]

The last column: the most bytes one collective call sent (the summary's
largest_send). (Per-step deltas of the step events' running totals are not
a measure of one exchange: the devices' counters are read when the event is
made, which may be part-way into the next step's exchange.)

Standard library only; no PyTorch needed.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

from svg_frame import frame

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CASES = [
    ("every_step", []),
    ("every_step bf16", ["sync.codec=\"bf16\""]),
    ("every_step powersgd r4", ["sync.codec=\"powersgd\"", "sync.powersgd_rank=4"]),
    ("every_step powersgd r4 start 100", ["sync.codec=\"powersgd\"", "sync.powersgd_rank=4",
                                          "sync.powersgd_start_step=100"]),
    ("every_step powersgd r4 start 0", ["sync.codec=\"powersgd\"", "sync.powersgd_rank=4",
                                        "sync.powersgd_start_step=0"]),
    ("every_step powersgd r1", ["sync.codec=\"powersgd\"", "sync.powersgd_rank=1"]),
    ("diloco H=4", ["sync.mode=\"diloco\"", "sync.every=4"]),
    ("diloco H=8", ["sync.mode=\"diloco\"", "sync.every=8"]),
    ("diloco H=16", ["sync.mode=\"diloco\"", "sync.every=16"]),
    ("diloco H=64", ["sync.mode=\"diloco\"", "sync.every=64"]),
    ("local_sgd H=16", ["sync.mode=\"local_sgd\"", "sync.every=16"]),
    ("diloco H=16 int8", ["sync.mode=\"diloco\"", "sync.every=16", "sync.codec=\"int8\""]),
    ("diloco H=16 bf16", ["sync.mode=\"diloco\"", "sync.every=16", "sync.codec=\"bf16\""]),
    ("diloco H=64 int8", ["sync.mode=\"diloco\"", "sync.every=64", "sync.codec=\"int8\""]),
    ("diloco H=16 P=4", ["sync.mode=\"diloco\"", "sync.every=16", "sync.fragments=4"]),
    ("diloco H=16 P=4 int8", ["sync.mode=\"diloco\"", "sync.every=16", "sync.fragments=4", "sync.codec=\"int8\""]),
    ("diloco H=16 delay", ["sync.mode=\"diloco\"", "sync.every=16", "sync.delay=1"]),
    ("diloco H=16 int8 delay", ["sync.mode=\"diloco\"", "sync.every=16", "sync.codec=\"int8\"", "sync.delay=1"]),
]


def run(dpactor, sets, seed, epochs, extra):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = [dpactor, "--model", os.path.join(ROOT, "configs/mlp.cfg"), "--quiet", "--cpus", "2",
               "--metrics", metrics, "--set", 'train.checkpoint_dir=""', "--set", "train.log_every=1",
               "--set", f"train.seed={seed}", "--set", f"train.epochs={epochs}", "--set", "sync.workers=4"]
        for s in sets + extra:
            cmd += ["--set", s]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
        records = [json.loads(line) for line in open(metrics)]
    summary = next(r for r in records if r["event"] == "summary")
    curve, sent = [], 0
    for r in records:
        if r["event"] == "step":
            sent = r["bytes_sent"]
        elif r["event"] == "epoch":
            curve.append((sent, r["test_accuracy"]))
    return summary, curve


def svg(curves, path):
    w, h, left, bottom = 640, 400, 70, 50
    xs = [b for c in curves.values() for b, _ in c if b > 0]
    ys = [a for c in curves.values() for _, a in c]
    x0, x1 = math.log10(min(xs)), math.log10(max(xs))
    y0, y1 = math.floor(min(ys) * 50) / 50, math.ceil(max(ys) * 50) / 50
    px = lambda b: left + (math.log10(b) - x0) / (x1 - x0) * (w - left - 20)
    py = lambda a: h - bottom - (a - y0) / (y1 - y0) * (h - bottom - 20)
    colors = ["#000000", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    out = frame(w, h, left, bottom, 20, "MB sent by the collectives (log scale)", "test accuracy")
    for e in range(math.floor(x0), math.ceil(x1) + 1):
        if x0 <= e <= x1:
            out.append(f'<text x="{px(10 ** e):.0f}" y="{h - bottom + 15}" text-anchor="middle">{10 ** e / 1e6:g}</text>')
    for i in range(6):
        a = y0 + (y1 - y0) * i / 5
        out.append(f'<text x="{left - 5}" y="{py(a) + 4:.0f}" text-anchor="end">{a:.2f}</text>')
    for i, (name, c) in enumerate(curves.items()):
        pts = " ".join(f"{px(b):.1f},{py(a):.1f}" for b, a in c if b > 0)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colors[i % len(colors)]}" stroke-width="2"/>')
        out.append(f'<text x="{w - 160}" y="{h - bottom - 20 - 16 * i}" fill="{colors[i % len(colors)]}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dpactor", default=os.path.join(ROOT, "build/bin/dpactor"))
    p.add_argument("--seeds", default="42,43,44")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--svg", default=os.path.join(ROOT, "docs/perf/rounds.svg"))
    p.add_argument("--only", default="", help="comma-separated case names to run (default: all); the first is the base")
    p.add_argument("--set", action="append", default=[], help="a config override for every case, e.g. straggler.policy=\"none\"")
    a = p.parse_args()
    cases = CASES if not a.only else [c for name in a.only.split(",") for c in CASES if c[0] == name]
    seeds = [int(s) for s in a.seeds.split(",")]
    rows, curves = [], {}
    for name, sets in cases:
        accs, sent, largest = [], [], []
        for seed in seeds:
            summary, curve = run(a.dpactor, sets, seed, a.epochs, a.set)
            accs.append(summary["test_accuracy"])
            sent.append(summary["bytes_sent"])
            largest.append(summary["largest_send"])
            if seed == seeds[0]:
                curves[name] = curve
        rows.append((name, statistics.median(accs), accs, statistics.median(sent), statistics.median(largest)))
        print(f"{name}: accuracy {accs} bytes {sent} largest call {largest}", file=sys.stderr, flush=True)
    base_acc, base_bytes = rows[0][1], rows[0][3]
    print(f"{len(seeds)} seeds ({a.seeds}), {a.epochs} epochs, 2 CPU replicas, K = 4 logical workers"
          f"{', ' + ', '.join(a.set) if a.set else ''}\n")
    print(f"| mode | test accuracy (median) | vs {rows[0][0]} | MB sent (median) | fewer bytes | largest call, KB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, acc, accs, sent, largest in rows:
        print(f"| {name} | {acc:.4f} ({', '.join(f'{x:.4f}' for x in accs)}) | {100 * (acc - base_acc):+.2f} points "
              f"| {sent / 1e6:.1f} | {base_bytes / sent:.1f}x | {largest / 1e3:.0f} |")
    svg(curves, a.svg)
    print(f"\ncurves: {os.path.relpath(a.svg, ROOT)}")


if __name__ == "__main__":
    main()
