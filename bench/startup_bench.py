#!/usr/bin/python3
"""Start-up of the plain MLP job with and without the libtorch plugin built.

    cmake -S . -B build-notorch -G Ninja -DDPACTOR_WITH_TORCH=OFF -DDPACTOR_BUILD_TESTS=OFF \\
        -DDPACTOR_BUILD_BENCH=OFF && cmake --build build-notorch --target dpactor
    bench/startup_bench.py --with build/bin/dpactor --without build-notorch/bin/dpactor

Runs the two programs alternately, `--rounds` times each, on a job that does
as little as possible besides starting: the default MLP on a small synthetic
set for one step, no evaluation, no checkpoint. Prints the median wall time of
each and the difference, and whether either program links libtorch (the
plugin is loaded only for model.kind = "torchscript"; See Note [The libtorch
plugin]).
"""
import argparse
import statistics
import subprocess
import time

JOB = ["--cpus", "2", "--quiet", "--epochs", "1", "--set", 'data.format="synthetic"', "--set",
       "data.synthetic_train=512", "--set", "data.synthetic_test=64", "--set", "train.max_steps=1", "--set",
       "train.eval_every=0", "--set", 'train.checkpoint_dir=""']


def links_torch(program):
    out = subprocess.run(["ldd", program], capture_output=True, text=True).stdout
    return "libtorch" in out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--with", dest="with_torch", default="build/bin/dpactor")
    p.add_argument("--without", default="build-notorch/bin/dpactor")
    p.add_argument("--model", default="configs/mlp.cfg")
    p.add_argument("--rounds", type=int, default=21)
    a = p.parse_args()
    times = {a.with_torch: [], a.without: []}
    for _ in range(a.rounds):
        for program in (a.without, a.with_torch):
            t = time.perf_counter()
            subprocess.run([program, "--model", a.model, *JOB], check=True, capture_output=True)
            times[program].append(time.perf_counter() - t)
    w, wo = statistics.median(times[a.with_torch]), statistics.median(times[a.without])
    print("| build | links libtorch | median start-to-exit, 1-step MLP job |")
    print("| --- | --- | ---: |")
    print(f"| with the torch plugin ({a.with_torch}) | {links_torch(a.with_torch)} | {w * 1000:.1f} ms |")
    print(f"| without ({a.without}) | {links_torch(a.without)} | {wo * 1000:.1f} ms |")
    print(f"\ndifference: {(w - wo) * 1000:+.1f} ms over {a.rounds} alternating rounds")


if __name__ == "__main__":
    main()
