#!/usr/bin/python3
"""Many worker processes on one machine (issue 35, not a timed test).

A coordinator (1 CPU replica) and N worker processes (1 CPU replica each) on
127.0.0.1 train a small synthetic job (a 32-32-10 MLP, 4 samples a member a
step, one slice each in reproducible mode) over Gloo, through shared memory
(the default) or over TCP (cluster.shared_memory=false). For each N it
measures:

  - the time from starting the processes to the first committed step;
  - the coordinator's CPU time per step (user + system, /proc), quiet, and
    that of the average process (the coordinator and the workers);
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

With --keep DIR, each run's coordinator log is kept at --log-level debug,
and `--phases-of DIR` prints, from those logs, the medians of when each
phase of a recovery or a join ended after the kill or the start of the new
processes (the fault noticed, every survivor suspended, the next generation
announced, its group formed and the state adopted, its first step).

With --floor, it also times what forming the next generation's group costs
any Gloo user on this machine: Gloo's own full mesh of that many idle
processes (build/bin/gloo_bench --form), the new group's size after the
kills and after the joins (kept in DIR too). With --svg PATH, it plots the
next generation's times (medians) and the floor against the worker count;
`--plot-of DIR --svg PATH` plots what DIR keeps, so that runs of several
invocations (a case run again on a quiet machine) make one plot.

One line per (N, transport, case); a run that fails says why and goes on.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from svg_frame import frame

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
                everyone = [coord] + procs
                cpu0, t0, n0 = cpu_seconds(coord.pid), time.time(), len(w.steps)
                all0 = sum(cpu_seconds(p.pid) for p in everyone)
                time.sleep(3.0)
                w.poll()
                cpu1, n1 = cpu_seconds(coord.pid), len(w.steps)
                all1 = sum(cpu_seconds(p.pid) for p in everyone)
                result["coordinator_ms_per_step"] = 1e3 * (cpu1 - cpu0) / max(1, n1 - n0)
                result["process_ms_per_step"] = 1e3 * (all1 - all0) / max(1, n1 - n0) / len(everyone)
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


def phases_of(keep):
    """Medians, per (workers, transport, case), of the seconds after the kill
    (or the new processes' start) at which each phase ended, read from the
    kept coordinator logs (their clock is UTC, to the millisecond)."""
    import datetime
    import glob
    rows = {}
    for path in sorted(glob.glob(os.path.join(keep, "*.json"))):
        r = json.load(open(path))
        if "event_at" not in r or not r.get("next_generation_s"):
            continue
        workers, transport, case, _ = os.path.basename(path)[:-5].split("-")
        at = datetime.datetime.fromtimestamp(r["event_at"], datetime.timezone.utc)
        t0 = at.hour * 3600 + at.minute * 60 + at.second + at.microsecond / 1e6
        ev = {}
        for line in open(path[:-5] + ".out", errors="replace"):
            m = re.match(r"dpactor: (\d\d):(\d\d):(\d\d\.\d+) \w+: (.*)", line)
            if not m:
                continue
            t = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)) - t0
            msg = m.group(4)
            if t < -0.5:
                continue
            if case == "kill" and "removed: exited" in msg:
                ev.setdefault("noticed", t)
            if msg.startswith("node late") and "joined with" in msg:
                ev.setdefault("first joined", t)
                ev["last joined"] = t
            if "every member suspended or gone" in msg:
                ev.setdefault("suspended", t)
            if re.match(r"generation [1-9]\d* from step", msg):
                ev.setdefault("announced", t)
            if re.search(r"generation [1-9]\d* formed and its state adopted", msg):
                ev.setdefault("formed", t)
        ev["first step"] = r["next_generation_s"]
        rows.setdefault((int(workers), transport, case), []).append(ev)
    names = ["noticed", "suspended", "first joined", "last joined", "announced", "formed", "first step"]
    print("| workers | transport | case | runs | " + " | ".join(names) + " |")
    print("| ---: | --- | --- | ---: |" + " ---: |" * len(names))
    for key in sorted(rows):
        evs = rows[key]
        cells = [statistics.median([e[n] for e in evs if n in e]) if any(n in e for e in evs) else None
                 for n in names]
        print(f"| {key[0]} | {key[1]} | {key[2]} | {len(evs)} | " +
              " | ".join("" if c is None else f"{c:.2f}" for c in cells) + " |")


def kept_series(keep):
    """The plot's series from the runs and floors kept in `keep`: medians."""
    import glob
    runs, series = {}, {}
    for path in glob.glob(os.path.join(keep, "*.json")):
        r = json.load(open(path))
        name = os.path.basename(path)[:-5]
        if name.startswith("floor-"):
            series.setdefault(f"Gloo mesh alone, {r['case']}", []).append((r["workers"], r["seconds"]))
        elif r.get("next_generation_s"):
            workers, transport, case, _ = name.split("-")
            runs.setdefault((int(workers), transport, case), []).append(r)
    for (workers, transport, case), rs in sorted(runs.items()):
        what = "killed" if case == "kill" else "joined"
        once = sorted({r.get("once", "-") for r in rs})
        m = statistics.median([r["next_generation_s"] for r in rs])
        print(f"| {workers} | {transport} | {case} | {len(rs)} | {m:.3f} | {', '.join(once)} |")
        series.setdefault(f"{what}, {transport}", []).append((workers, m))
    return series


def gloo_floor(gloo_bench, processes, repeats):
    """Median seconds for Gloo's own connectFullMesh (and a first call) of
    `processes` idle processes (gloo_bench --form), or None."""
    proc = subprocess.run([gloo_bench, "--form", str(processes), "--repeats", str(repeats)],
                          capture_output=True, text=True)
    m = re.search(r"gloo connectFullMesh.*median ([0-9.]+) s", proc.stdout)
    return float(m.group(1)) if m else None


def svg(series, bounds, path):
    """series: {name: [(workers, seconds)]}, a dashed line where the name
    says "Gloo"; bounds: {label: seconds}, drawn as grey lines."""
    w, h, left, bottom = 640, 400, 60, 50
    xs = sorted({x for pts in series.values() for x, _ in pts})
    ys = [y for pts in series.values() for _, y in pts] + list(bounds.values())
    y1 = math.ceil(max(ys))
    px = lambda x: left + (math.log2(x) - math.log2(xs[0])) / max(1e-9, math.log2(xs[-1]) - math.log2(xs[0])) * (w - left - 200)
    py = lambda y: h - bottom - y / y1 * (h - bottom - 20)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#000000"]
    out = frame(w, h, left, bottom, 190, "worker processes (2 cores)", "seconds to the next generation's first step",
                xlabel_at=(left + w - 190) / 2)
    for x in xs:
        out.append(f'<text x="{px(x):.0f}" y="{h - bottom + 15}" text-anchor="middle">{x}</text>')
    for i in range(y1 + 1):
        out.append(f'<text x="{left - 5}" y="{py(i) + 4:.0f}" text-anchor="end">{i}</text>')
    for label, y in bounds.items():
        out.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{w - 190}" y2="{py(y):.1f}" stroke="#999999"/>')
        out.append(f'<text x="{w - 185}" y="{py(y) + 4:.1f}" fill="#999999">{label}</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = colors[i % len(colors)]
        dash = ' stroke-dasharray="6 4"' if "Gloo" in name else ""
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(pts))
        out.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        out.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>' for x, y in pts)
        out.append(f'<text x="{w - 185}" y="{40 + 16 * i}" fill="{color}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


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
    p.add_argument("--floor", action="store_true",
                   help="also time Gloo's own full mesh of the next generation's size (build/bin/gloo_bench --form)")
    p.add_argument("--gloo-bench", default=os.path.join(ROOT, "build/bin/gloo_bench"))
    p.add_argument("--svg", metavar="PATH", help="plot the next generation's times against the worker count")
    p.add_argument("--phases-of", metavar="DIR", help="only print the phases of the runs kept in DIR")
    p.add_argument("--plot-of", metavar="DIR", help="only print the medians of the runs kept in DIR and plot them (--svg)")
    a = p.parse_args()
    if a.phases_of:
        phases_of(a.phases_of)
        return
    if a.plot_of:
        print("| workers | transport | case | runs | next generation (s), median | every sample once |")
        print("| ---: | --- | --- | ---: | ---: | --- |")
        series = kept_series(a.plot_of)
        if a.svg and series:
            svg(series, {"1 s (8 killed)": 1.0, "2 s (8 joined)": 2.0}, a.svg)
        return
    series = {}
    print("| workers | transport | case | first step (s) | coordinator CPU ms/step | CPU ms/step a process | step ms "
          "| next generation (s) | every sample once |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for workers in [int(w) for w in a.workers.split(",")]:
        for transport in [t for t in a.transports.split(",") if t]:
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
                      f"{med('process_ms_per_step')} | {med('step_ms')} | {med('next_generation_s')} | {', '.join(once)}"
                      f"{' (' + str(len(errors)) + ' failed: ' + errors[0][:200] + ')' if errors else ''} |",
                      flush=True)
                if med("next_generation_s") != "-":
                    what = "killed" if case == "kill" else "joined"
                    series.setdefault(f"{what}, {transport}", []).append(
                        (workers, float(med("next_generation_s"))))
        if a.floor:
            for case in [c for c in a.cases.split(",") if c in ("kill", "join")]:
                processes = workers + 1 + (a.kill if case == "join" else -a.kill)
                s = gloo_floor(a.gloo_bench, processes, a.repeats)
                print(f"| {workers} | Gloo's own full mesh of {processes} idle processes ({case}) | | | | | | "
                      f"{'-' if s is None else f'{s:.3f}'} | |", flush=True)
                if s is not None:
                    series.setdefault(f"Gloo mesh alone, {case}", []).append((workers, s))
                    if a.keep:
                        os.makedirs(a.keep, exist_ok=True)
                        with open(os.path.join(a.keep, f"floor-{workers}-{case}.json"), "w") as f:
                            json.dump({"workers": workers, "case": case, "processes": processes, "seconds": s}, f)
    if a.svg and series:
        svg(series, {"1 s (8 killed)": 1.0, "2 s (8 joined)": 2.0}, a.svg)


if __name__ == "__main__":
    main()
