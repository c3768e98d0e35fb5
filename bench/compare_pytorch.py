#!/usr/bin/python3
"""Side-by-side comparison of dpactor and PyTorch on this machine, in one run.

    scripts/setup --bench && scripts/build && bench/compare_pytorch.py

Trains the default MLP (784-256-128-10, ReLU, cross-entropy, SGD with momentum
0.9) on Fashion-MNIST at global batch sizes 1, 16, 64, 128, 256, 512 and 1024,
with:
  dpactor, 1 CPU replica      (OpenBLAS 2 threads: one replica on both cores;
                               1 thread with train.reproducible)
  dpactor, 2 CPU replicas     (OpenBLAS 1 thread each)
each with train.reproducible on and off (--mode both, the default), side by side.
  PyTorch 1+1                 (torch 1 thread, OpenBLAS 1 thread)
  PyTorch 1+2                 (torch 1 thread, OpenBLAS 2 threads)
  PyTorch DDP, Gloo           (2 processes of 1+1 threads; global batch split in two)
Every configuration is timed in windows of about 0.25 s after a warm-up
window; the table gives medians over 6 windows. Both sides flush denormals to
zero. Also measured in the same run: OpenBLAS sgemm with 2 threads on the
MLP's largest GEMM shape, (512, 784) x (784, 256), the reference for the
"fraction of sgemm" column.

GFLOP/s count the exact arithmetic of one training sample of this MLP:
  sum over layers l of  2 in_l out_l + out_l   (forward GEMM and bias)
                      + 2 in_l out_l + out_l   (weight and bias gradients)
                      + 2 in_l out_l           (input gradient; not for l = 0)
  = 1,007,892 FLOP per sample.

With --model cnn: the CNN of configs/cnn.cfg (conv 5x5 16, pool, conv 5x5 32,
pool, linear; 28,938 parameters) on dpactor's libtorch replica, against the
same module in PyTorch eager, at global batch 128 by default:
  dpactor, 1 CPU replica      (2 intra-op threads; 1 with train.reproducible)
  dpactor, 2 CPU replicas     (1 intra-op thread each)
  PyTorch 1 thread, PyTorch 2 threads (intra-op), PyTorch DDP, Gloo (2 x 1)
dpactor's slices (train.micro_batch) are 32 with train.reproducible and 64
without. GFLOP/s and the sgemm column are left out for the CNN.

Writes compare.csv and compare.png (samples/s against batch size) to --out.
"""
import argparse
import csv
import json
import os
import statistics
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOP_PER_SAMPLE = 1_007_892
PY = "/usr/bin/python3"


def dpactor_run(dpactor, replicas, batch, reproducible, windows=7, model="mlp"):
    per_sample = (300e-6 if replicas == 1 else 160e-6) if model == "cnn" else (7e-6 if replicas == 1 else 5e-6)
    est = max(60e-6, batch * per_sample)
    per = max(3, int(0.25 / est))
    extra = []
    if model == "cnn":
        extra = ["--set", f"train.micro_batch={32 if reproducible else 64}"]
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = [dpactor, "--model", os.path.join(ROOT, f"configs/{model}.cfg"), "--quiet", "--cpus", str(replicas), *extra,
               "--batch-size", str(batch), "--metrics", metrics, "--epochs", "100000",
               "--set", f"train.max_steps={per * windows}", "--set", f"train.log_every={per}",
               "--set", "train.eval_every=0", "--set", 'train.checkpoint_dir=""',
               "--set", f"train.reproducible={'true' if reproducible else 'false'}"]
        subprocess.run(cmd, check=True, capture_output=True)
        steps = [json.loads(l) for l in open(metrics) if '"event":"step"' in l]
    times = [batch / r["samples_per_s"] * 1e6 for r in steps[1:]]  # the first window is warm-up
    return statistics.median(times), times


def same_blas_kernels(dpactor):
    """Both sides run the OpenBLAS kernels dpactor would choose.

    PyTorch's Linear layers call the same OpenBLAS. When OpenBLAS does not know
    the CPU, dpactor restarts itself with wider kernels (Note [OpenBLAS kernels
    on CPUs newer than the library]); PyTorch would keep the narrow ones. Set
    OPENBLAS_CORETYPE for every process here, so the comparison is of the
    engines, not of the kernels.
    """
    if "OPENBLAS_CORETYPE" not in os.environ:
        log = subprocess.run([dpactor, "--model", os.path.join(ROOT, "configs/mlp.cfg"), "--print-config",
                              "--log-level", "info"], check=True, capture_output=True, text=True).stderr
        m = re.search(r"restarted with OPENBLAS_CORETYPE=(\w+)", log)
        if m:
            os.environ["OPENBLAS_CORETYPE"] = m.group(1)
    return os.environ.get("OPENBLAS_CORETYPE", "OpenBLAS's own choice")


def pytorch_run(mode, blas_threads, batches, model="mlp", threads=1):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(blas_threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run([PY, os.path.join(ROOT, "bench/pytorch_mlp.py"), mode, "--batches", ",".join(map(str, batches)),
                          "--model", model, "--threads", str(threads)],
                         check=True, capture_output=True, text=True, env=env).stdout
    return {r["batch"]: r for r in map(json.loads, out.splitlines()) if "batch" in r}


def run_dpactor(a, batches, results, model):
    """dpactor on 1 and 2 replicas in the modes asked for; returns the configurations' names."""
    modes = {"both": (True, False), "reproducible": (True,), "fast": (False,)}[a.mode]
    names = []
    for reproducible in modes:
        for replicas in (1, 2):
            name = f"dpactor {replicas} replica{'s' if replicas > 1 else ''}" + \
                   ("" if len(modes) == 1 else (" reproducible" if reproducible else " fast"))
            names.append(name)
            for b in batches:
                print(f"running {name}, batch {b} ...", file=sys.stderr)
                results[(name, b)] = dpactor_run(a.dpactor, replicas, b, reproducible, model=model)[0]
    return names


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dpactor", default=os.path.join(ROOT, "build/bin/dpactor"))
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    p.add_argument("--batches", help="global batch sizes (default: 1,16,64,128,256,512,1024; cnn: 128)")
    p.add_argument("--out", default=os.path.join(ROOT, "build/bench"))
    p.add_argument("--mode", choices=("both", "reproducible", "fast"), default="both",
                   help="dpactor with train.reproducible on, off, or both side by side")
    a = p.parse_args()
    batches = [int(b) for b in (a.batches or ("128" if a.model == "cnn" else "1,16,64,128,256,512,1024")).split(",")]
    os.makedirs(a.out, exist_ok=True)
    if a.model == "cnn":
        return compare_cnn(a, batches)

    kernels = same_blas_kernels(a.dpactor)
    sgemm = json.loads(subprocess.run([PY, os.path.join(ROOT, "bench/pytorch_mlp.py"), "sgemm"], check=True,
                                      capture_output=True, text=True,
                                      env=dict(os.environ, OPENBLAS_NUM_THREADS="2")).stdout)["sgemm_gflops"]
    results = {}  # (config, batch) -> step_us
    print("running PyTorch 1+1 ...", file=sys.stderr)
    for b, r in pytorch_run("single", 1, batches).items():
        results[("PyTorch 1+1", b)] = r["step_us"]
    print("running PyTorch 1+2 ...", file=sys.stderr)
    for b, r in pytorch_run("single", 2, batches).items():
        results[("PyTorch 1+2", b)] = r["step_us"]
    print("running PyTorch DDP ...", file=sys.stderr)
    for b, r in pytorch_run("ddp", 1, batches).items():
        results[("PyTorch DDP Gloo 2x(1+1)", b)] = r["step_us"]
    dpactor_configs = run_dpactor(a, batches, results, "mlp")

    configs = dpactor_configs + ["PyTorch 1+1", "PyTorch 1+2", "PyTorch DDP Gloo 2x(1+1)"]
    torch_configs = configs[len(dpactor_configs):]
    rows = []
    print(f"\nOpenBLAS kernels, both sides: {kernels}")
    print(f"OpenBLAS sgemm, 2 threads, (512,784)x(784,256): {sgemm:.1f} GFLOP/s\n")
    print("| batch | configuration | step us | samples/s | GFLOP/s | of sgemm | vs best PyTorch |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for b in batches:
        torch_best = min((results[(c, b)] for c in torch_configs if (c, b) in results), default=None)
        for c in configs:
            if (c, b) not in results:
                continue
            us = results[(c, b)]
            sps = b / us * 1e6
            gflops = sps * FLOP_PER_SAMPLE / 1e9
            ratio = torch_best / us if torch_best else float("nan")
            rows.append({"batch": b, "config": c, "step_us": us, "samples_per_s": sps, "gflops": gflops,
                         "fraction_of_sgemm": gflops / sgemm, "speedup_vs_best_pytorch": ratio})
            print(f"| {b} | {c} | {us:,.1f} | {sps:,.0f} | {gflops:.1f} | {gflops / sgemm:.0%} | {ratio:.2f}x |")
    with open(os.path.join(a.out, "compare.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for c in configs:
            pts = [(r["batch"], r["samples_per_s"]) for r in rows if r["config"] == c]
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=c)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("global batch size")
        ax.set_ylabel("training samples/s")
        ax.set_title("784-256-128-10 MLP, SGD momentum, 2 cores")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "compare.png"), dpi=120)
        plotted = " and compare.png"
    except ImportError:
        print("matplotlib is not installed (scripts/setup --bench): no plot", file=sys.stderr)
        plotted = ""
    print(f"\nwrote {os.path.join(a.out, 'compare.csv')}{plotted}")


def compare_cnn(a, batches):
    """The CNN side by side: dpactor's libtorch replica against PyTorch eager."""
    kernels = same_blas_kernels(a.dpactor)
    results = {}
    torch_configs = [("PyTorch 1 thread", "single", 1), ("PyTorch 2 threads", "single", 2),
                     ("PyTorch DDP Gloo 2x1", "ddp", 1)]
    for name, mode, threads in torch_configs:
        print(f"running {name} ...", file=sys.stderr)
        for b, r in pytorch_run(mode, 1, batches, model="cnn", threads=threads).items():
            results[(name, b)] = r["step_us"]
    dpactor_configs = run_dpactor(a, batches, results, "cnn")
    names = dpactor_configs + [n for n, _, _ in torch_configs]
    print(f"\nCNN of configs/cnn.cfg; OpenBLAS kernels, both sides: {kernels}\n")
    print("| batch | configuration | step us | samples/s | vs best PyTorch | vs PyTorch DDP |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    rows = []
    for b in batches:
        best = min(results[(n, b)] for n, _, _ in torch_configs[:2])
        ddp = results[("PyTorch DDP Gloo 2x1", b)]
        for n in names:
            us = results[(n, b)]
            rows.append({"batch": b, "config": n, "step_us": us, "samples_per_s": b / us * 1e6,
                         "speedup_vs_best_pytorch": best / us, "speedup_vs_ddp": ddp / us})
            print(f"| {b} | {n} | {us:,.0f} | {b / us * 1e6:,.0f} | {best / us:.2f}x | {ddp / us:.2f}x |")
    with open(os.path.join(a.out, "compare_cnn.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print(f"\nwrote {os.path.join(a.out, 'compare_cnn.csv')}")


if __name__ == "__main__":
    main()
