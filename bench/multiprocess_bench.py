#!/usr/bin/python3
"""Multi-node mode on one machine, side by side in one run (issue 12, not a
timed test):

  1. the default MLP at global batch 128 on 2 processes of 1 CPU replica each
     (dpactor --coordinator plus one dpactor --join worker; their gradients
     through shared memory, the default, and with cluster.shared_memory=false
     over Gloo's TCP on loopback) against PyTorch DDP
     with Gloo in the same layout (2 processes, 1+1 threads), and against
     dpactor's 2 replicas in one process; median step time of windows of
     about 0.25 s after a warm-up window, as bench/compare_pytorch.py does;
  2. the Gloo backend's all-reduce and a training step's collectives against
     the in-process backend (bench/gloo_bench);
  3. recovery after kill -9 of a worker: a coordinator and 2 workers of 1
     replica; one worker is killed mid-run; the coordinator's
     "recovered: step S committed X ms after the fault" gives the time from
     the fault's detection to the next committed step. Median of --kills.

    scripts/setup --bench && scripts/build && bench/multiprocess_bench.py
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"
sys.path.insert(0, os.path.join(ROOT, "bench"))
from compare_pytorch import dpactor_run, pytorch_run, same_blas_kernels  # noqa: E402


def start_coordinator(dpactor, args, cwd):
    out = open(os.path.join(cwd, "coordinator.out"), "w+")
    p = subprocess.Popen([dpactor, "--coordinator", "--listen", "127.0.0.1:0", "--model",
                          os.path.join(ROOT, "configs/mlp.cfg"), "--gpus", "0"] + args,
                         stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    for _ in range(300):
        out.seek(0)
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", out.read())
        if m:
            return p, out, m.group(1)
        time.sleep(0.05)
    p.kill()
    raise RuntimeError("the coordinator did not listen")


def start_worker(dpactor, port, node, cwd, args=()):
    return subprocess.Popen([dpactor, "--join", f"127.0.0.1:{port}", "--cpus", "1", "--node", node] + list(args),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)


def two_processes(dpactor, shared_memory, batch=128, windows=7):
    """Median step time (us) of the coordinator+worker layout, measured as dpactor_run does."""
    transport = ["--set", f"cluster.shared_memory={'true' if shared_memory else 'false'}"]
    est = batch * 20e-6
    per = max(3, int(0.25 / est))
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        coord, out, port = start_coordinator(dpactor, [
            "--quiet", "--cpus", "1", "--wait-devices", "2", "--batch-size", str(batch), "--metrics", metrics,
            "--epochs", "100000", "--set", f"train.max_steps={per * windows}", "--set", f"train.log_every={per}",
            "--set", "train.eval_every=0", "--set", 'train.checkpoint_dir=""'] + transport, tmp)
        worker = start_worker(dpactor, port, "w", tmp, transport)
        coord.wait(timeout=600)
        worker.wait(timeout=60)
        if coord.returncode != 0:
            out.seek(0)
            raise RuntimeError("coordinator failed: " + out.read())
        steps = [json.loads(l) for l in open(metrics) if '"event":"step"' in l]
    times = [batch / r["samples_per_s"] * 1e6 for r in steps[1:]]
    return statistics.median(times)


def recovery(dpactor, kills):
    """ms from a worker's kill -9 being detected to the next committed step, one run per kill."""
    found = []
    for k in range(kills):
        with tempfile.TemporaryDirectory() as tmp:
            coord, out, port = start_coordinator(dpactor, ["--cpus", "1", "--wait-devices", "3",
                                                           "--set", "train.max_steps=1500"], tmp)
            a = start_worker(dpactor, port, "A", tmp)
            b = start_worker(dpactor, port, "B", tmp)
            for _ in range(600):
                out.seek(0)
                if "generation 0" in out.read():
                    break
                time.sleep(0.05)
            time.sleep(1.0)
            b.send_signal(signal.SIGKILL)
            coord.wait(timeout=300)
            a.wait(timeout=60)
            b.wait()
            out.seek(0)
            text = out.read()
            m = re.search(r"recovered: step \d+ committed ([0-9.]+) ms after the fault", text)
            if coord.returncode != 0 or not m:
                print(f"kill {k}: no recovery found (coordinator exit {coord.returncode})", file=sys.stderr)
                continue
            found.append(float(m.group(1)))
            print(f"kill {k + 1}/{kills}: recovered {m.group(1)} ms after the fault", file=sys.stderr)
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dpactor", default=os.path.join(ROOT, "build/bin/dpactor"))
    p.add_argument("--gloo-bench", default=os.path.join(ROOT, "build/bin/gloo_bench"))
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3, help="runs of each throughput configuration (medians)")
    p.add_argument("--cases", default="ddp,shm,tcp,threads",
                   help="throughput configurations, of ddp,shm,tcp,threads (DDP always runs: the ratios' base)")
    a = p.parse_args()
    cases = set(a.cases.split(",")) | {"ddp"}
    unknown = cases - {"ddp", "shm", "tcp", "threads"}
    if unknown:
        p.error(f"--cases: unknown {', '.join(sorted(unknown))} (known: ddp, shm, tcp, threads)")
    kernels = same_blas_kernels(a.dpactor)
    rows = {"dpactor 2 processes x 1 replica, shared memory": [],
            "dpactor 2 processes x 1 replica, Gloo TCP": [],
            "dpactor 1 process x 2 replicas": [],
            "PyTorch DDP Gloo 2x(1+1)": []}
    for r in range(a.repeats):
        print(f"round {r + 1}/{a.repeats} ...", file=sys.stderr)
        rows["PyTorch DDP Gloo 2x(1+1)"].append(pytorch_run("ddp", 1, [128])[128]["step_us"])
        if "shm" in cases:
            rows["dpactor 2 processes x 1 replica, shared memory"].append(two_processes(a.dpactor, True))
        if "tcp" in cases:
            rows["dpactor 2 processes x 1 replica, Gloo TCP"].append(two_processes(a.dpactor, False))
        if "threads" in cases:
            rows["dpactor 1 process x 2 replicas"].append(dpactor_run(a.dpactor, 2, 128, True)[0])
    rows = {name: times for name, times in rows.items() if times}
    ddp = statistics.median(rows["PyTorch DDP Gloo 2x(1+1)"])
    print(f"\nOpenBLAS kernels, both sides: {kernels}")
    print("global batch 128, default MLP, reproducible mode; medians of", a.repeats, "runs\n")
    print("| configuration | step (us) | samples/s | vs PyTorch DDP Gloo |")
    print("| --- | ---: | ---: | ---: |")
    for name, times in rows.items():
        t = statistics.median(times)
        print(f"| {name} | {t:,.1f} | {128 / t * 1e6:,.0f} | {ddp / t:.2f}x |")
    print()
    for args in ([], ["--step"]):
        out = subprocess.run([a.gloo_bench] + args, check=True, capture_output=True, text=True).stdout
        print(("a training step's collectives" if args else "all-reduce") + ":")
        print(out.strip())
    if a.kills > 0:
        times = recovery(a.dpactor, a.kills)
        if times:
            print(f"\nrecovery after kill -9 of a worker (fault detected -> next step committed), "
                  f"{len(times)} runs: median {statistics.median(times):.1f} ms, "
                  f"min {min(times):.1f}, max {max(times):.1f}")


if __name__ == "__main__":
    main()
