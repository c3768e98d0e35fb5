#!/usr/bin/env bash
# sync.mode = "async" across processes against one process (docs/PERFORMANCE.md,
# "Asynchronous rounds", "Across processes"): a coordinator with one CPU
# replica and two worker processes with one each, then one process with three,
# the default job, K = 4, H = 16, 3 epochs; three times, alternating. Prints
# each run's summary lines (test accuracy, samples/s, rounds, bytes sent).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/build/bin/dpactor
model=$root/configs/mlp.cfg
common=(--set 'sync.mode="async"' --set sync.workers=4 --set sync.every=16 --set train.eval_every=0 --epochs 3)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for i in 1 2 3; do
  d=$scratch/processes$i
  mkdir -p "$d/w1" "$d/w2"
  (cd "$d" && "$bin" --model "$model" --coordinator --listen 127.0.0.1:0 --gpus 0 --cpus 1 --wait-devices 3 \
    "${common[@]}" --checkpoint-dir ck > c.log 2>&1) &
  coordinator=$!
  port=""
  for _ in $(seq 60); do
    port=$(grep -o "listening on [0-9.:]*" "$d/c.log" 2>/dev/null | head -1 | sed 's/.*://' || true)
    [[ -n $port ]] && break
    sleep 0.5
  done
  (cd "$d/w1" && "$bin" --join "127.0.0.1:$port" --node w1 --cpus 1 > w.log 2>&1) &
  (cd "$d/w2" && "$bin" --join "127.0.0.1:$port" --node w2 --cpus 1 > w.log 2>&1) &
  wait
  echo "processes $i: $(grep -E 'test accuracy|sent' "$d/c.log" | tr '\n' ' ')"
  d=$scratch/one$i
  mkdir -p "$d"
  (cd "$d" && "$bin" --model "$model" --gpus 0 --cpus 3 "${common[@]}" --checkpoint-dir ck > c.log 2>&1)
  echo "one process $i: $(grep -E 'test accuracy|sent' "$d/c.log" | tr '\n' ' ')"
done
