#!/usr/bin/env bash
# The CUDA/NCCL path of disttrain, on one GPU, in a few minutes. Run from the repo root on a GPU machine:
#   bash scripts/gpu_check.sh            (results in ${OUT:-gpu_check_out}/)
# Checks: torch sees CUDA; DDP and FSDP2 over NCCL (world 1, through torchrun) train and agree with a
# single-process run; bf16 vs fp32 throughput and MFU against the H100/H200 table; allocator peak memory.
set -euo pipefail
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
PY=${PY:-python3}
if [ ! -x .venv/bin/disttrain ]; then
  $PY -m venv .venv
  .venv/bin/pip install -q -e . || .venv/bin/pip install -q --no-deps -e .
fi
DT=.venv/bin/disttrain
# PART=plan: only the step-time plan and torch.compile on this GPU (issue 18), ~3 minutes.
if [ "${PART:-all}" = plan ]; then
  PLAN=(--train.micro-batch 32 --train.global-batch 32 --precision.dtype bf16)
  $DT estimate --parallel.nproc 1 "${PLAN[@]}" --explain 2>&1 | tee "$OUT/estimate_plan.txt" | grep -E "step|compute|recommended|peak"
  for c in off blocks; do
    $DT run "${PLAN[@]}" --train.steps 40 --train.eval-interval 0 --train.generate-chars 0 \
      --metrics.log-interval 10 --parallel.nproc 1 --parallel.compile $c --run.root "$OUT/runs" \
      --run.name "compile-$c" 2>&1 | tail -2
  done
  .venv/bin/python - "$OUT" <<'PY' | tee "$OUT/plan_summary.txt"
import json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
def last(name):
    return [json.loads(x) for x in (out / "runs" / name / "metrics.jsonl").read_text().splitlines()][-1]
off, blk = last("compile-off"), last("compile-blocks")
print(f"compile blocks / off tokens/s = {blk['tokens_per_s'] / off['tokens_per_s']:.2f}x; "
      f"MFU off {off['mfu'] * 100:.1f}%, blocks {blk['mfu'] * 100:.1f}%")
text = (out / "estimate_plan.txt").read_text()
m = re.search(r"step, with overlap \*\s+(\d+) ms", text)
if m:
    print(f"predicted step {m.group(1)} ms vs measured {off['step_time_s'] * 1e3:.0f} ms (compile off), "
          f"{blk['step_time_s'] * 1e3:.0f} ms (blocks)")
PY
  exit 0
fi
.venv/bin/python - <<'PY' | tee "$OUT/env.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "nccl", torch.cuda.nccl.version())
PY
COMMON=(--train.steps 60 --train.eval-interval 0 --train.generate-chars 0 --metrics.log-interval 20
        --train.global-batch 32 --train.micro-batch 32 --parallel.nproc 1 --run.root "$OUT/runs")
# --launch.max-restarts 1 forces the torchrun path (a real NCCL process group) even with one process.
for s in single ddp fsdp; do
  extra=(); [ "$s" != single ] && extra=(--launch.max-restarts 1)
  $DT run "${COMMON[@]}" "${extra[@]}" --parallel.strategy $s --precision.dtype fp32 --run.name "fp32-$s" \
    --train.deterministic 2>&1 | tail -3
done
$DT run "${COMMON[@]}" --precision.dtype bf16 --run.name bf16-single 2>&1 | tail -3
.venv/bin/python - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
runs = Path(sys.argv[1]) / "runs"
def recs(name):
    return [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines()]
ref = [r["loss"] for r in recs("fp32-single") if "loss" in r]
for s in ("ddp", "fsdp"):
    got = [r["loss"] for r in recs(f"fp32-{s}") if "loss" in r]
    print(f"{s} vs single (fp32) max |dloss| = {max(abs(a - b) for a, b in zip(got, ref)):.2e}")
f32, b16 = recs("fp32-single")[-1], recs("bf16-single")[-1]
print(f"bf16/fp32 tokens/s = {b16['tokens_per_s'] / f32['tokens_per_s']:.2f}x; bf16 MFU {b16['mfu']*100:.1f}%")
print(f"allocator peak (bf16 single) = {b16['peak_memory_bytes'][0] / 2**20:.0f} MiB")
PY
# The memory plan against the CUDA allocator: predicted vs max_memory_allocated per strategy (world 1).
$DT estimate --parallel.nproc 1 --measure --train.micro-batch 32 --train.global-batch 32 2>&1 | tee "$OUT/estimate_measure.txt" | tail -8
# Long context: the plan counts SDPA as CUDA's fused kernels run it (q, k, v, out, log-sum-exp saved: O(T) per
# head, not the T x T probabilities); predicted vs allocator peak at context 2048.
$DT estimate --parallel.nproc 1 --measure --model.context 2048 --train.micro-batch 4 --train.global-batch 4 2>&1 \
  | tee "$OUT/estimate_measure_ctx2048.txt" | tail -8
# Checkpoint round trip through NCCL + DCP (async thread), then resume: the second run continues from the first one's final checkpoint (step 60).
$DT run "${COMMON[@]}" --launch.max-restarts 1 --parallel.strategy fsdp --checkpoint.interval 40 \
  --run.name ckpt-fsdp 2>&1 | tail -2
$DT run "${COMMON[@]}" --launch.max-restarts 1 --parallel.strategy fsdp --train.steps 80 --run.name ckpt-fsdp \
  2>&1 | grep -E "resumed|done" | tee "$OUT/resume.txt"
# doctor: CUDA/NCCL versions, devices, NCCL all-reduce bandwidth.
$DT doctor 2>&1 | tee "$OUT/doctor.txt" | tail -20 || true
