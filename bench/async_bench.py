#!/usr/bin/env python3
"""Bounded-staleness asynchronous rounds against diloco with a slowed worker
(issue "Never wait for the slowest", acceptance 1): the default job
(Fashion-MNIST MLP, 15 epochs) with K = 4 logical workers on 4 CPU replicas,
replica 3 slowed 3x (--inject slow:3:3), sync.mode = "diloco" and "async" at
the same H (sync.every = 16), run side by side (the modes alternate within
each seed). For each run: the wall-clock seconds until an epoch's test
accuracy first reaches the target (0.87), from the process's start and from
the training's (its first membership record, after the data is loaded),
read by following the metrics file as it is written, and the final test
accuracy.
Prints medians over the seeds and their ratio; writes the accuracy-against-
time curves of every run as an SVG.

    bench/async_bench.py [--dpactor build/bin/dpactor] [--seeds 42,43,44] [--epochs 15] [--target 0.87]
                         [--slow slow:3:3] [--svg docs/perf/async.svg] [--set sync.quorum=3 ...]

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
import time

from svg_frame import frame

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(dpactor, mode, seed, a):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = [dpactor, "--model", os.path.join(ROOT, "configs/mlp.cfg"), "--quiet", "--cpus", "4",
               "--metrics", metrics, "--set", 'train.checkpoint_dir=""', "--set", f"train.seed={seed}",
               "--set", f"train.epochs={a.epochs}", "--set", "sync.workers=4", "--set", f'sync.mode="{mode}"',
               "--set", f"sync.every={a.every}"]
        if a.slow != "none":
            cmd += ["--inject", a.slow]
        for s in a.set:
            cmd += ["--set", s]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        curve, summary, seen, t0 = [], None, 0, None
        while True:
            done = proc.poll() is not None
            if os.path.exists(metrics):
                with open(metrics) as f:
                    lines = f.read().split("\n")
                now = time.monotonic() - start
                for line in lines[seen:-1]:  # complete lines only
                    r = json.loads(line)
                    if r["event"] == "membership" and t0 is None:
                        t0 = now
                    if r["event"] == "epoch":
                        curve.append((now, r["test_accuracy"]))
                    elif r["event"] == "summary":
                        summary = r
                seen = max(seen, len(lines) - 1)
            if done:
                break
            time.sleep(0.02)
        if proc.returncode != 0:
            sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr.read()}")
    reached = next((t for t, acc in curve if acc >= a.target), math.inf)
    return reached, reached - t0, summary["test_accuracy"], curve


def svg(curves, path, target):
    w, h, left, bottom = 640, 400, 70, 50
    xs = [t for c in curves.values() for t, _ in c]
    ys = [acc for c in curves.values() for _, acc in c]
    x1 = max(xs)
    y0, y1 = math.floor(min(ys) * 50) / 50, math.ceil(max(ys) * 50) / 50
    px = lambda t: left + t / x1 * (w - left - 20)
    py = lambda acc: h - bottom - (acc - y0) / (y1 - y0) * (h - bottom - 20)
    colors = {"diloco": "#1f77b4", "async": "#d62728"}
    out = frame(w, h, left, bottom, 20, "seconds from the process start", "test accuracy") + [
           f'<line x1="{left}" y1="{py(target):.1f}" x2="{w - 20}" y2="{py(target):.1f}" stroke="#999" stroke-dasharray="4"/>']
    step = 10 if x1 > 40 else 5
    for t in range(0, int(x1) + 1, step):
        out.append(f'<text x="{px(t):.0f}" y="{h - bottom + 15}" text-anchor="middle">{t}</text>')
    for i in range(round((y1 - y0) * 100) + 1):  # a tick every point of accuracy
        acc = y0 + i / 100
        out.append(f'<text x="{left - 5}" y="{py(acc) + 4:.0f}" text-anchor="end">{acc:.2f}</text>')
    for (mode, seed), c in curves.items():
        pts = " ".join(f"{px(t):.1f},{py(acc):.1f}" for t, acc in c)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colors[mode]}" stroke-width="1.5"/>')
    for i, mode in enumerate(colors):
        out.append(f'<text x="{w - 200}" y="{h - bottom - 20 - 16 * i}" fill="{colors[mode]}">{mode} (one line a seed)</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dpactor", default=os.path.join(ROOT, "build/bin/dpactor"))
    p.add_argument("--seeds", default="42,43,44")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--every", type=int, default=16)
    p.add_argument("--target", type=float, default=0.87)
    p.add_argument("--slow", default="slow:3:3", help='the fault that slows a worker, or "none"')
    p.add_argument("--svg", default=os.path.join(ROOT, "docs/perf/async.svg"))
    p.add_argument("--set", action="append", default=[], help="a config override for both modes")
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    results = {"diloco": [], "async": []}
    curves = {}
    for seed in seeds:
        for mode in ("diloco", "async"):
            reached, trained, final, curve = run(a.dpactor, mode, seed, a)
            results[mode].append((reached, trained, final))
            curves[(mode, seed)] = curve
            print(f"{mode} seed {seed}: {a.target} at {reached:.1f} s ({trained:.1f} s of training), final {final:.4f}, "
                  f"curve {[(round(t, 1), round(acc, 4)) for t, acc in curve]}", file=sys.stderr, flush=True)
    med = {m: [statistics.median(r[i] for r in results[m]) for i in range(3)] for m in results}
    print(f"{len(seeds)} seeds ({a.seeds}), {a.epochs} epochs, 4 CPU replicas, K = 4, H = {a.every}, {a.slow}"
          f"{', ' + ', '.join(a.set) if a.set else ''}\n")
    print(f"| mode | seconds to test accuracy {a.target}, from the process's start (median) | runs | "
          f"from the training's start (median) | runs | final test accuracy (median) | runs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for m in results:
        cols = []
        for i, fmt in ((0, ".1f"), (1, ".1f"), (2, ".4f")):
            cols += [f"{med[m][i]:{fmt}}", ", ".join(f"{r[i]:{fmt}}" for r in results[m])]
        print(f"| {m} | " + " | ".join(cols) + " |")
    print(f"\nasync reaches {a.target} {med['diloco'][0] / med['async'][0]:.2f}x sooner from the process's start, "
          f"{med['diloco'][1] / med['async'][1]:.2f}x from the training's; final accuracy "
          f"{100 * (med['async'][2] - med['diloco'][2]):+.2f} points")
    if a.svg:
        svg(curves, a.svg, a.target)


if __name__ == "__main__":
    main()
