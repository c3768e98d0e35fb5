#!/usr/bin/python3
"""Many worker processes on one machine (issue 35, not a timed test).

A coordinator (1 CPU replica) and N worker processes (1 CPU replica each) on
127.0.0.1 train a small synthetic job (a 32-32-10 MLP, 4 samples a member a
step, one slice each in reproducible mode) over Gloo, through shared memory
(the default) or over TCP (cluster.shared_memory=false). For each N it
measures:

  - the time from starting the processes to the first committed step;
  - the coordinator's CPU time per step (user + system, /proc), quiet;
  - with K workers killed with -9 at once: the time from the kill to the
    first step committed by the next generation (as its record appears in
    the coordinator's metrics file, watched every 5 ms);
  - with K workers started at once mid-run: the time from their start to
    the first step committed by the next generation (which has them, or
    some of them when they arrive at different step boundaries);
  - every sample of every epoch once, by the devices' own account: the
    coordinator's metrics file holds every device's "trained" records, summed
    per epoch against the training set (count and digest).

    scripts/build && bench/many_processes_bench.py --workers 32,64 --kill 8 --repeats 1

One line per (N, transport, case); a run that fails says why and goes on.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MASK = (1 << 64) - 1


def sample_digest(i):
    """train/sample_digest.hpp's splitmix64."""
    z = (i + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def write_job(path, members, steps_per_epoch, epochs):
    batch = 4 * members
    with open(path, "w") as f:
        f.write(f"""[model]
layers = [32, 32, 10]

[data]
format = "synthetic"
synthetic_train = {batch * steps_per_epoch}
synthetic_test = 256

[train]
epochs = {epochs}
batch_size = {batch}
micro_batch = 4
checkpoint_dir = ""
record_trained = true
eval_every = 0
log_every = 1

[cluster]
min_devices = 1
""")
    return batch * steps_per_epoch


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class watcher:
    """The coordinator's metrics file, read as it grows (it is flushed a
    line at a time): each step record with the wall time it was seen."""

    def __init__(self, path):
        self.path, self.offset, self.steps = path, 0, []

    def poll(self):
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind("\n") + 1
        self.offset += len(data[:end].encode())
        now = time.time()
        for line in data[:end].splitlines():
            if '"event":"step"' in line:
                r = json.loads(line)
                self.steps.append((now, r["generation"]))

    def until(self, predicate, timeout, proc):
        """Polls every 5 ms until predicate(steps) holds: the time it did, or None."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.poll()
            if predicate(self.steps):
                return time.time()
            if proc.poll() is not None:
                self.poll()
                return time.time() if predicate(self.steps) else None
            time.sleep(0.005)
        return None


def wait_for(path, pattern, timeout, proc=None):
    deadline = time.time() + timeout
    rx = re.compile(pattern)
    while time.time() < deadline:
        with open(path, errors="replace") as f:
            m = rx.search(f.read())
        if m:
            return m
        if proc is not None and proc.poll() is not None:
            return None
        time.sleep(0.02)
    return None


def exactly_once(metrics, rows, epochs):
    # A record counts unless a later generation starts at or before its step
    # (the step was rolled back; Note [A remote device's record arrives
    # before its gradients]).
    samples, digests, records, starts = {}, {}, [], {}
    with open(metrics) as f:
        for line in f:
            if '"event":"membership"' in line:
                r = json.loads(line)
                starts[r["generation"]] = r["step"]
            if '"event":"trained"' in line:
                records.append(json.loads(line))
    for r in records:
        if any(g > r.get("generation", 0) and first <= r["step"] - 1 for g, first in starts.items()):
            continue
        samples[r["epoch"]] = samples.get(r["epoch"], 0) + r["samples"]
        digests[r["epoch"]] = (digests.get(r["epoch"], 0) + r["digest"]) & MASK
    want = 0
    for i in range(rows):
        want = (want + sample_digest(i)) & MASK
    bad = [e for e in range(epochs) if samples.get(e) != rows or digests.get(e) != want]
    return "all once" if not bad else f"epochs {bad} wrong: samples {[samples.get(e) for e in bad]} of {rows}"


def one_run(dpactor, workers, shm, case, kill, steps_per_epoch, epochs, rendezvous_s, keep=None):
    members = workers + 1
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.cfg")
        rows = write_job(job, members, steps_per_epoch, epochs)
        metrics = os.path.join(tmp, "m.jsonl")
        transport = ["--set", f"cluster.shared_memory={'true' if shm else 'false'}"]
        timeouts = ["--set", f"cluster.rendezvous_timeout_s={rendezvous_s}"]
        out_path = os.path.join(tmp, "coordinator.out")
        out = open(out_path, "w")
        started = time.time()
        coord = subprocess.Popen([dpactor, "--coordinator", "--listen", "127.0.0.1:0", "--model", job, "--cpus", "1",
                                  "--wait-devices", str(members), "--metrics", metrics] + transport + timeouts +
                                 (["--log-level", "debug"] if keep else []),
                                 stdout=out, stderr=subprocess.STDOUT, cwd=tmp)
        m = wait_for(out_path, r"listening on 127\.0\.0\.1:(\d+)", 60, coord)
        if not m:
            coord.kill()
            return {"error": "the coordinator did not listen"}
        port = m.group(1)
        procs = []

        def start(n, tag):
            for i in range(n):
                procs.append(subprocess.Popen([dpactor, "--join", f"127.0.0.1:{port}", "--cpus", "1", "--node",
                                               f"{tag}{i}"] + transport,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp))

        start(workers, "w")
        result = {}
        w = watcher(metrics)
        try:
            first = w.until(lambda st: len(st) > 0, 600, coord)
            if first is None:
                return {"error": "no first step: " + open(out_path, errors="replace").read()[-2000:]}
            result["first_step_s"] = first - started
            if case == "quiet":
                time.sleep(0.5)
                w.poll()
                cpu0, t0, n0 = cpu_seconds(coord.pid), time.time(), len(w.steps)
                time.sleep(3.0)
                w.poll()
                cpu1, n1 = cpu_seconds(coord.pid), len(w.steps)
                result["coordinator_ms_per_step"] = 1e3 * (cpu1 - cpu0) / max(1, n1 - n0)
                result["step_ms"] = 1e3 * (time.time() - t0) / max(1, n1 - n0)
            else:
                time.sleep(1.0)
                w.poll()
                generation = w.steps[-1][1]
                at = time.time()
                if case == "kill":
                    for victim in procs[:kill]:
                        victim.send_signal(signal.SIGKILL)
                else:
                    start(kill, "late")
                result["event_at"] = at
                after = w.until(lambda st: st[-1][1] > generation, 300, coord)
                result["next_generation_s"] = (after - at) if after else None
            coord.wait(timeout=900)
            result["exit"] = coord.returncode
            result["once"] = exactly_once(metrics, rows, epochs)
            if coord.returncode != 0:
                out.flush()
                tail = [l for l in open(out_path, errors="replace").read().splitlines() if "error" in l.lower()]
                result["once"] += f" (coordinator exit {coord.returncode}: {tail[-1][-300:] if tail else '?'})"
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            if coord.poll() is None:
                coord.kill()
                coord.wait()
            out.close()
            if keep:
                os.makedirs(keep, exist_ok=True)
                name = f"{workers}-{'shm' if shm else 'tcp'}-{case}-{int(started)}"
                shutil.copy(out_path, os.path.join(keep, name + ".out"))
                shutil.copy(metrics, os.path.join(keep, name + ".jsonl"))
                with open(os.path.join(keep, name + ".json"), "w") as f:
                    json.dump(result, f)
        return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dpactor", default=os.path.join(ROOT, "build/bin/dpactor"))
    p.add_argument("--workers", default="32,64", help="worker process counts, comma-separated")
    p.add_argument("--kill", type=int, default=8, help="workers killed (and started) at once")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--transports", default="shm,tcp")
    p.add_argument("--cases", default="quiet,kill,join")
    p.add_argument("--steps-per-epoch", type=int, default=200)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--rendezvous-timeout", type=float, default=10.0,
                   help="cluster.rendezvous_timeout_s (the default 10 s is too short for 65 processes on 2 cores)")
    p.add_argument("--keep", metavar="DIR", help="keep each run's coordinator output, metrics and figures in DIR")
    a = p.parse_args()
    print("| workers | transport | case | first step (s) | coordinator CPU ms/step | step ms | next generation (s) "
          "| every sample once |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for workers in [int(w) for w in a.workers.split(",")]:
        for transport in a.transports.split(","):
            for case in a.cases.split(","):
                runs = [one_run(a.dpactor, workers, transport == "shm", case, a.kill, a.steps_per_epoch, a.epochs,
                                a.rendezvous_timeout, a.keep)
                        for _ in range(a.repeats)]

                def med(key):
                    v = [r[key] for r in runs if r.get(key) is not None]
                    return f"{statistics.median(v):.3f}" if v else "-"

                errors = [r["error"] for r in runs if "error" in r]
                once = sorted({r.get("once", "-") for r in runs if "error" not in r})
                print(f"| {workers} | {transport} | {case} | {med('first_step_s')} | {med('coordinator_ms_per_step')} | "
                      f"{med('step_ms')} | {med('next_generation_s')} | {', '.join(once)}"
                      f"{' (' + str(len(errors)) + ' failed: ' + errors[0][:200] + ')' if errors else ''} |",
                      flush=True)


if __name__ == "__main__":
    main()
