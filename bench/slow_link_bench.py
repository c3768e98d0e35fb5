#!/usr/bin/python3
"""The round modes over a slow link (issue 29, acceptance 3; not a timed test).

A coordinator and 2 worker processes of 1 CPU replica each, over Gloo's TCP
(cluster.shared_memory = false), inside a network namespace this script
makes (unshare -rn) whose loopback is rate-limited with tc's token bucket
(tbf) to each --rates value ("none": no limit, the same MTU of 1500). Side
by side, interleaved, --repeats times each:

  every_step        the gradients all-reduced every step
  diloco            sync.mode = "diloco", H = --every, K = 3, sync.codec = --codec
  diloco+delay      the same with sync.delay = 1 (sync.outer_lr = 0.35): each round's
                    exchange runs while the next round computes (sync.overlap)
  delay, no overlap the same with sync.overlap = false: the exchange between the rounds
  every_step fast, every_step bf16, every_step powersgd fast
                    (issue 30, acceptance 4: not in the default --modes) every_step
                    with train.reproducible = false, with sync.codec = "bf16"
                    (reproducible), and with sync.codec = "powersgd" (rank 4 from
                    the first step; fast mode, as PowerSGD runs across processes)
  no exchange       the same job with nothing sent: 3 independent processes
                    of one logical worker each (sync.workers = 1, a third of
                    the batch), run at the same time; their rates added

Reported: the median of the step events' samples_per_s after the first
--warmup of them (the rate over each log interval), per run; the medians of
the runs; and the ratios the issue names (diloco / every_step at each rate,
diloco+delay / no exchange). The machine has 2 cores for 3 processes: every
mode shares them the same way.

    scripts/build && bench/slow_link_bench.py
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs/mlp.cfg")


def in_namespace():
    return os.environ.get("DPACTOR_SLOW_LINK_NETNS") == "1"


def set_rate(rate):
    # An Ethernet MTU: tbf drops a packet larger than its bucket for good, and
    # loopback's 64 KiB packets are.
    subprocess.run(["ip", "link", "set", "lo", "mtu", "1500", "up"], check=True)
    if rate == "none":  # the same namespace and MTU, no limit: what the link costs beside the rest
        subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], stderr=subprocess.DEVNULL)
        return
    subprocess.run(["tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", rate, "burst", "64kb", "latency",
                    "50ms"], check=True)


def rate_of(metrics, warmup):
    rates = []
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            if j.get("event") == "step" and j.get("samples_per_s"):
                rates.append(j["samples_per_s"])
    rates = rates[warmup:]
    if not rates:
        raise RuntimeError(f"{metrics}: no step events after the warm-up")
    return statistics.median(rates)


def cluster_run(dpactor, common, cwd, tag):
    """Coordinator + 2 workers over TCP; the coordinator's step rate."""
    metrics = os.path.join(cwd, f"{tag}.jsonl")
    out = open(os.path.join(cwd, f"{tag}.coordinator.out"), "w+")
    c = subprocess.Popen([dpactor, "--coordinator", "--listen", "127.0.0.1:0", "--model", CONFIG, "--gpus", "0",
                          "--cpus", "1", "--wait-devices", "3", "--metrics", metrics, "--quiet",
                          "--checkpoint-dir", os.path.join(cwd, f"{tag}.ck")] + common,
                         stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    port = None
    for _ in range(600):
        out.seek(0)
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", out.read())
        if m:
            port = m.group(1)
            break
        time.sleep(0.05)
    if port is None:
        c.kill()
        raise RuntimeError("the coordinator did not listen")
    workers = [subprocess.Popen([dpactor, "--join", f"127.0.0.1:{port}", "--cpus", "1", "--node", f"w{i}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd) for i in (1, 2)]
    if c.wait(timeout=900) != 0:
        out.seek(0)
        raise RuntimeError(f"{tag}: the coordinator failed:\n{out.read()[-3000:]}")
    for w in workers:
        w.wait(timeout=60)
    return metrics


def alone_runs(dpactor, common, cwd, tag):
    """3 independent one-process runs at once; their metrics files."""
    runs = []
    for i in range(3):
        metrics = os.path.join(cwd, f"{tag}.{i}.jsonl")
        runs.append((subprocess.Popen([dpactor, "--model", CONFIG, "--gpus", "0", "--cpus", "1", "--metrics", metrics,
                                       "--quiet", "--checkpoint-dir", os.path.join(cwd, f"{tag}.{i}.ck")] + common,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd), metrics))
    for p, _ in runs:
        if p.wait(timeout=900) != 0:
            raise RuntimeError(f"{tag}: a run alone failed")
    return [m for _, m in runs]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dpactor", default=os.path.join(ROOT, "build/bin/dpactor"))
    ap.add_argument("--rates", default="1gbit,100mbit")
    ap.add_argument("--every", type=int, default=16)
    ap.add_argument("--batch", type=int, default=96, help="global batch (3 workers of a third each)")
    ap.add_argument("--steps", type=int, default=960,
                    help="every_step's steps at 1 Gbit/s (a tenth at 100 Mbit/s); the round modes run as many inner steps")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2, help="step events left out at the start")
    ap.add_argument("--codec", default="fp32", help="sync.codec of the diloco modes (fp32, bf16, int8)")
    ap.add_argument("--modes", default="every_step,diloco,diloco+delay,delay, no overlap,no exchange".replace(", ", "|"),
                    help="comma-separated modes to run (\"delay|no overlap\" for \"delay, no overlap\")")
    args = ap.parse_args()
    if not in_namespace():
        env = dict(os.environ, DPACTOR_SLOW_LINK_NETNS="1")
        sys.exit(subprocess.run(["unshare", "-rn", sys.executable, os.path.abspath(__file__)] + sys.argv[1:],
                                env=env).returncode)
    rounds = max(1, args.steps // args.every)
    base = ["--batch-size", str(args.batch), "--epochs", "1", "--set", "train.eval_every=0", "--set",
            "cluster.shared_memory=false"]

    def every_step_at(rate):
        # every_step is ~10x slower at 100 Mbit/s: fewer steps keep its runs short.
        if rate == "none":
            return base + ["--set", f"train.max_steps={args.steps}", "--set", f"train.log_every={max(1, args.steps // 12)}"]
        mbit = int(re.match(r"(\d+)", rate).group(1)) * (1000 if rate.endswith("gbit") else 1)
        steps = max(48, min(args.steps, args.steps * mbit // 1000))
        return base + ["--set", f"train.max_steps={steps}", "--set", f"train.log_every={max(1, steps // 12)}"]
    diloco = base + ["--set", "sync.mode=\"diloco\"", "--set", f"sync.codec=\"{args.codec}\"", "--set", f"sync.every={args.every}", "--set",
                     f"train.max_steps={rounds}", "--set", f"train.log_every={max(1, rounds // 12)}"]
    fast = ["--set", "train.reproducible=false"]
    bf16 = ["--set", "sync.codec=\"bf16\""]
    powersgd = fast + ["--set", "sync.codec=\"powersgd\"", "--set", "sync.powersgd_rank=4", "--set",
                       "sync.powersgd_start_step=0"]
    delayed = diloco + ["--set", "sync.delay=1", "--set", "sync.outer_lr=0.35"]
    between = delayed + ["--set", "sync.overlap=false"]
    alone = ["--batch-size", str(args.batch // 3), "--epochs", "1", "--set", "train.eval_every=0", "--set",
             "sync.mode=\"diloco\"", "--set", f"sync.every={args.every}", "--set", "sync.workers=1", "--set",
             f"train.max_steps={rounds}", "--set", f"train.log_every={max(1, rounds // 12)}"]
    print(f"# up to {args.steps} steps of global batch {args.batch} (every_step) or {rounds} rounds of H = {args.every} "
          f"(diloco, K = 3, sync.codec = {args.codec}); coordinator + 2 workers over TCP; medians of {args.repeats}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rate in args.rates.split(","):
            set_rate(rate)
            wanted = [m.replace("|", ", ") for m in args.modes.split(",")]
            rows = {m: [] for m in wanted}
            runs = {
                "every_step": lambda r: rate_of(cluster_run(args.dpactor, every_step_at(rate), tmp, f"e{rate}{r}"), args.warmup),
                "diloco": lambda r: rate_of(cluster_run(args.dpactor, diloco, tmp, f"d{rate}{r}"), args.warmup),
                "diloco+delay": lambda r: rate_of(cluster_run(args.dpactor, delayed, tmp, f"l{rate}{r}"), args.warmup),
                "delay, no overlap": lambda r: rate_of(cluster_run(args.dpactor, between, tmp, f"b{rate}{r}"), args.warmup),
                "every_step fast": lambda r: rate_of(cluster_run(args.dpactor, every_step_at(rate) + fast, tmp,
                                                                 f"f{rate}{r}"), args.warmup),
                "every_step bf16": lambda r: rate_of(cluster_run(args.dpactor, every_step_at(rate) + bf16, tmp,
                                                                 f"h{rate}{r}"), args.warmup),
                "every_step powersgd fast": lambda r: rate_of(cluster_run(args.dpactor, every_step_at(rate) + powersgd,
                                                                          tmp, f"p{rate}{r}"), args.warmup),
                "no exchange": lambda r: sum(rate_of(m, args.warmup) for m in alone_runs(args.dpactor, alone, tmp, f"a{rate}{r}")),
            }
            for r in range(args.repeats):
                for m in wanted:
                    rows[m].append(runs[m](r))
            med = {k: statistics.median(v) for k, v in rows.items()}
            results[rate] = med
            print(f"\n## loopback at {rate}")
            print("| mode | samples/s (median) | runs |")
            print("| --- | --- | --- |")
            for k, v in rows.items():
                print(f"| {k} | {med[k]:,.0f} | {', '.join(f'{x:,.0f}' for x in v)} |")
            ratios = [("diloco / every_step", "diloco", "every_step", "x"),
                      ("bf16 / every_step", "every_step bf16", "every_step", "x"),
                      ("powersgd fast / every_step fast", "every_step powersgd fast", "every_step fast", "x"),
                      ("diloco+delay / no exchange", "diloco+delay", "no exchange", ""),
                      ("overlap / no overlap", "diloco+delay", "delay, no overlap", "x"),
                      ("diloco / no exchange", "diloco", "no exchange", "")]
            print("; ".join(f"{name} = {med[a] / med[b]:.2f}{unit}" for name, a, b, unit in ratios if a in med and b in med))
    return 0


if __name__ == "__main__":
    sys.exit(main())
