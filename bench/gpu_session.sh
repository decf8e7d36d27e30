#!/usr/bin/env bash
# One session's GPU validation, in stages that each fit one device call (10 minutes at most),
# so that a session's device time is not spent on a stage cut off before it wrote anything.
#
#   STAGE=tests  bash bench/gpu_session.sh   # the GPU tests (about 6-8 minutes)
#   STAGE=models bash bench/gpu_session.sh   # GPT-2 small and the Llama-style model, bf16
#   STAGE=more   bash bench/gpu_session.sh   # BERT, the f32 rows, the torch.compile backend
#
# From the project root on the GPU machine, after `source .whl/install.sh` (docs/gpu.md); logs
# and result files go to $OUT (default ./gpu-session-out), each written as soon as it is made.
# A model row needs 150-270 s (eager, torch.compile's compile, tgc's first compile with its
# measurements, the second compile), so each model gets its own timeout of MODEL_TIMEOUT
# seconds (default 280) and a stage runs at most two of them.
set -uo pipefail
out=${OUT:-gpu-session-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "${COMMIT:-unknown}")
model_timeout=${MODEL_TIMEOUT:-280}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
echo "commit $commit" | tee -a "$out/device.txt"

pytest_gpu() {  # name, files...: pytest without xdist (the GPU is one), its tail kept
  local name=$1
  shift
  timeout 240 python3 -m pytest -o addopts="" -q -p no:cacheprovider --tb=short "$@" \
    >"$out/$name.txt" 2>&1
  tail -3 "$out/$name.txt"
}

model() {  # one model row of bench/real_models.py, with its own timeout
  timeout "$model_timeout" python3 bench/real_models.py --commit "$commit" --out "$out" "$@" \
    >"$out/real-models-$(echo "$*" | tr ' ,' '__').txt" 2>&1
  echo "real_models $* -> exit $?"
}

case "${STAGE:-tests}" in
tests)
  pytest_gpu route test/test_route_cuda.py test/test_graphs.py test/test_route.py \
    test/test_plan_memory.py test/test_noisy.py test/test_profile_torch_check.py
  pytest_gpu cuda test/test_cuda.py test/test_planner_cuda.py test/test_standalone.py
  ;;
models)
  model --only gpt2 --dtypes bf16 --profile
  model --only llama --dtypes bf16
  ;;
more)
  model --only bert --dtypes bf16
  pytest_gpu dynamo test/test_dynamo_backend.py test/test_hl_vision.py
  ;;
*)
  echo "STAGE must be tests, models or more" >&2
  exit 2
  ;;
esac
