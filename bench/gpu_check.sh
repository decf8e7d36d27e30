#!/usr/bin/env bash
# On the GPU machine, from the project root (after `source .whl/install.sh`): the GPU tests, the
# planner on every backend, and `tgc-run --backend auto --check` on every example. Logs go to
# $OUT (or ./gpu-check-out).
set -uo pipefail
out=${OUT:-gpu-check-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$out/device.txt"
python3 -m pytest -q -m cuda test/test_cuda.py 2>&1 | tail -5 | tee "$out/test_cuda.txt"
python3 -m pytest -q test/test_planner_cuda.py test/test_planner_torch.py test/test_planner_auto.py \
  test/test_planner_executor.py test/test_planner_kernels.py 2>&1 | tail -5 | tee "$out/test_planner.txt"
{
  for f in examples/*.tg; do
    echo "== $f"
    python3 -m tgc.tools.run "$f" --backend auto --check 2>&1 | tail -3
    python3 -m tgc.tools.run "$f" --backend cuda --check 2>&1 | tail -3
  done
  echo "== tgc-plan examples/gpt2_block.tg --list-paths 5"
  python3 -m tgc.tools.plan examples/gpt2_block.tg --list-paths 5 2>&1 | cut -c1-400
  echo "== tgc-plan examples/gpt2_block.tg --explain"
  python3 -m tgc.tools.plan examples/gpt2_block.tg --explain 2>&1 | head -150
} 2>&1 | tee "$out/planner_cli.txt"
# Models in (issue 9): the importers' PyTorch-side tests, then the tiny GPT-2/BERT exports on the
# cuda route beside eager and torch.compile (writes bench/results/models-*.md; copy it to $OUT).
python3 -m pytest -q test/test_import_torch.py test/test_import_models.py 2>&1 | tail -5 | tee "$out/test_importers.txt"
python3 bench/models_gpu.py --out "$out" 2>&1 | tail -40 | tee "$out/models_gpu.txt"
