#!/usr/bin/env bash
# One short session on a machine with a real NVIDIA GPU, everything gpemu wants measured, most valuable first:
#   1. smoke: `gpemu profile` of resnet18 at batch 16 (fp32, amp, per-op times): stops here if the profiler breaks
#   2. bench/gpu_micro.py: matmul / SDPA / conv NCHW+NHWC / batch norm / copy / launch rates
#   3. `pytest tests/gpu` (GPU_TESTS=0 skips it), then the drop-in reference runs: unmodified example scripts under
#      `gpemu run --gpu real` (iteration wall times)
#   4. the profile campaign, lease plan (Note [Lease plan] in gpemu/profiler/campaign.py), until the deadline
# Usage (repo root, on the GPU machine): OUT=dir bash bench/gpu_session.sh [total seconds, default 480]
# Results: $OUT/log.txt, $OUT/micro.csv, $OUT/dropin.tar.gz, $OUT/p/<gpu>.csv and $OUT/p/details/*.csv.
set -u
TOTAL_S=${1:-480}
START=$(date +%s)
OUT=${OUT:-out/gpu-session}
mkdir -p "$OUT/p" "$OUT/dropin"
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 GPEMU_CACHE_DIR=/tmp/gpemu-cache
PY=${PY:-python3}
left_s() { echo $((START + TOTAL_S - $(date +%s))); }
say() { echo "[$(($(date +%s) - START)) s] $*"; }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), torch.cuda.get_device_name())"
  lscpu | grep -E 'Model name|^CPU\(s\)|MHz' ; nproc
} > "$OUT/dropin/env.txt" 2>&1
cat "$OUT/dropin/env.txt"

say "1. smoke"
timeout 120 $PY -m gpemu profile --models resnet18 --batch-sizes 16 --dtype fp32,amp --out "$OUT/p" \
  --warmup 3 --reps 10 --op-batch-sizes 16 || say "smoke exited $?"
if ! grep -q ',forward,16,amp,' "$OUT"/p/*.csv 2>/dev/null; then
  say "smoke produced no resnet18 amp forward row: stopping"; ls -R "$OUT"; exit 3
fi
grep ',16,' "$OUT"/p/*.csv | head -12

say "2. micro-benchmarks"
timeout 90 $PY bench/gpu_micro.py --out "$OUT/micro.csv" --budget-s 60 > "$OUT/dropin/micro.log" 2>&1 || say "micro exited $?"
tail -3 "$OUT/dropin/micro.log"

if [ "${GPU_TESTS:-1}" = 1 ]; then
  say "3a. pytest tests/gpu"
  timeout 180 $PY -m pytest -q -m gpu tests/gpu -p no:cacheprovider > "$OUT/dropin/tests-gpu.log" 2>&1 || say "tests/gpu exited $?"
  tail -3 "$OUT/dropin/tests-gpu.log"
fi
say "3. drop-in reference runs"
real() {  # real NAME TIMEOUT_S CMD...
  local name=$1 limit=$2; shift 2
  timeout "$limit" $PY -m gpemu run --gpu real --report-json "$OUT/dropin/$name.json" -- "$@" \
    > "$OUT/dropin/$name.log" 2>&1 || say "$name exited $?"
  tail -2 "$OUT/dropin/$name.log"
}
real imagenet-resnet50-b128 60 $PY examples/imagenet/main.py --dummy -a resnet50 -b 128 -j 8 --iters 30 -p 10
real timm-resnet50-cl-fp16-b128 60 $PY examples/timm/train_synthetic.py --model resnet50 -b 128 --channels-last --steps 30
real timm-vit-b16-bf16-b64 60 $PY examples/timm/train_synthetic.py --model vit_base_patch16_224 -b 64 --amp-dtype bfloat16 --steps 30
real lm-d1024-l8-s1024-b8 60 $PY examples/transformer_lm.py --d-model 1024 --layers 8 --seq 1024 --batch-size 8 --vocab 32000 --iters 30
tar -czf "$OUT/dropin.tar.gz" -C "$OUT" dropin && rm -rf "$OUT/dropin"

# a GPU the package already ships a profile for (an H200, an H100): its rows join the output first, so the campaign
# resumes past them and spends the lease on the configurations nobody measured yet (the smoke step above re-measures)
$PY - "$OUT/p" <<'PYEOF' || say "seeding from the shipped profile failed"
import csv, sys
from pathlib import Path
from gpemu.profiles.db import builtin_profile_paths
for mine in Path(sys.argv[1]).glob("*.csv"):
    shipped = [p for p in builtin_profile_paths() if p.name == mine.name]
    if not shipped:
        continue
    with mine.open() as f:
        have = {(r["workload"], r["batch_size"], r["dtype"]) for r in csv.DictReader(f)}
    with shipped[0].open() as f:
        rows = [r for r in csv.DictReader(f) if (r["workload"], r["batch_size"], r["dtype"]) not in have]
    with mine.open("a", newline="") as f:
        csv.DictWriter(f, fieldnames=list(rows[0]) if rows else []).writerows(rows)
    print(f"seeded {len(rows)} shipped rows of {mine.name}: the campaign resumes past them")
PYEOF
BUDGET=$(($(left_s) - 25))
say "4. campaign, lease plan, ${BUDGET} s"
if [ "$BUDGET" -gt 20 ]; then
  timeout $((BUDGET + 60)) $PY -m gpemu.profiler.campaign --plan lease --out "$OUT/p" --budget-s "$BUDGET" \
    --warmup 3 --reps 12 --no-progress || say "campaign exited $?"
fi
wc -l "$OUT"/p/*.csv "$OUT"/p/details/*.csv
say "done"
