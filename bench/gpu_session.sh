#!/usr/bin/env bash
# One session's GPU validation, in stages that each fit one device call (10 minutes at most),
# so that a session's device time is not spent on a stage cut off before it wrote anything.
#
#   STAGE=tests      bash bench/gpu_session.sh  # the GPU tests but test_cuda.py (about 4 min)
#   STAGE=cuda       bash bench/gpu_session.sh  # test_cuda.py (over 150 s on an H200)
#   STAGE=validate   bash bench/gpu_session.sh  # kernels, tests and grid in one call (about 6
#                                               # minutes with xdist), and the grid's head dim
#                                               # 256 on both skeletons
#   STAGE=gemv       bash bench/gpu_session.sh  # the few-rows matmul: its GPU tests, then
#                                               # bench/matmul_gemv.py at 1-16 rows with every variant
#                                               # (about 2 minutes)
#   STAGE=decode     bash bench/gpu_session.sh  # the backend's GPU tests, then
#                                               # bench/decode_step.py: the decode step alone,
#                                               # back to back, batch 1 and 16, eager / tgc /
#                                               # default, then reduce-overhead in its own process,
#                                               # each mode's kernels by device time (about 8 min)
#   STAGE=tma        bash bench/gpu_session.sh  # the wgmma matmul's TMA copies: one GPU case
#                                               # alone first (a fault kills its process), then
#                                               # its test file with the few-rows matmul's
#                                               # prologues', bench/matmul_wgmma.py (TMA
#                                               # beside cp.async, mma.sync and cuBLAS) and
#                                               # bench/matmul_prologue.py
#   STAGE=persistent bash bench/gpu_session.sh  # the wgmma attention's persistent blocks: its GPU
#                                               # tests, then the grid at head dims 64, 80 and
#                                               # 128 with persistent=false and true (issue 24)
#   STAGE=attention-tma bash bench/gpu_session.sh  # the TMA attention kernel: its GPU tests with
#                                               # the other wgmma ones, then the grid at head dims
#                                               # 128, 64 and 80 with tma=false and true (issue 24)
#   STAGE=attention-merge bash bench/gpu_session.sh  # the TMA kernel's merged query tiles
#                                               # (merge_tiles): GPU tests, then the grid at
#                                               # head dims 128, 64, 80, 256 without and with it
#   STAGE=pdl        bash bench/gpu_session.sh  # programmatic dependent launches: the
#                                               # gemv's GPU tests (a dependent's first), the
#                                               # backend's, then the decode step at batch 1 and
#                                               # 16, tgc beside tgc-plain-launch (one database)
#   STAGE=attention-store bash bench/gpu_session.sh  # the TMA attention kernel's O by TMA
#                                               # stores (tma_store): a case alone, its GPU
#                                               # tests, the grid at 128, 80, 96 and 72 with it
#                                               # and without
#   STAGE=decode-merged bash bench/gpu_session.sh  # small sibling kernels in one launch
#                                               # (planner/horizontal.py): the planner's and the
#                                               # backend's GPU tests, then the decode step at
#                                               # batch 1 and 16, tgc beside tgc-unmerged
#   STAGE=attention-256 bash bench/gpu_session.sh  # head dim 256 with O stored by TMA from
#                                               # its one Q buffer: the grid at 256 with and
#                                               # without it
#   STAGE=decode-params bash bench/gpu_session.sh  # decode attention with each set of
#                                               # template parameters of DECODE_PARAMS (sets
#                                               # separated by ;, the defaults first), the cases
#                                               # of DECODE_ONLY (--only, default B1)
#   STAGE=halves     bash bench/gpu_session.sh  # the few-rows matmul's epilogue reading its
#                                               # product's halves (SiLU(gate) * up): its GPU
#                                               # tests with the prologue's and the gemv's, then
#                                               # bench/matmul_prologue.py, then the decode step
#                                               # at batch 1 (eager, tgc-unhalved, tgc)
#   STAGE=kernels    bash bench/gpu_session.sh  # the GPU tests of the kernels alone: attention
#                                               # (every head dim, decode), the few-rows matmul, the rotary and group
#                                               # norm fusions, cuBLASLt, the convolution
#   STAGE=models     bash bench/gpu_session.sh  # GPT-2 small and the Llama-style model, bf16,
#                                               # beside eager, compile and reduce-overhead
#   STAGE=backend    bash bench/gpu_session.sh  # GPT-2 and the Llama-style model, bf16, through
#                                               # torch.compile(backend="tgc") beside eager and
#                                               # compile default (issue 26, done-when 1)
#   STAGE=backend-bert bash bench/gpu_session.sh  # BERT the same way (issue 26's third model)
#   STAGE=attention  bash bench/gpu_session.sh  # bench/attention_tc.py: tgc's attention kernels
#                                               # against SDPA, prefill shapes and decode
#   STAGE=grid       bash bench/gpu_session.sh  # bench/attention_tc.py --grid: issue 24's grid
#                                               # of head dims, lengths and GQA beside SDPA
#   STAGE=autotune   bash bench/gpu_session.sh  # the same two beside max-autotune-no-cudagraphs
#                                               # alone (its compile of GPT-2 took 117 s)
#   STAGE=generate   bash bench/gpu_session.sh  # bench/generate.py: a 1.1 B Llama's generate(),
#                                               # batch 1: eager, tgc, transformers' own
#                                               # reduce-overhead compile, compile default and
#                                               # reduce-overhead, each in a process of its own,
#                                               # each profiled once more (cProfile)
#   STAGE=first-call bash bench/gpu_session.sh  # tgc's mode alone, batch 1, a fresh database:
#                                               # where its first call's minutes go (cProfile,
#                                               # tgc's log)
#   STAGE=generate16 bash bench/gpu_session.sh  # the same at batch 16 (TGC_DB=<the database
#                                               # an earlier stage's archive brought back,
#                                               # carried in the tree>: tgc measures only what
#                                               # is new)
#   STAGE=more       bash bench/gpu_session.sh  # ResNet-50, ViT-base, the UNet and the VAE
#                                               # decoder, bf16 at batch 8 (issue 25 item 5)
#   STAGE=vision-f32 bash bench/gpu_session.sh  # the same four in f32
#   STAGE=vision-b1  bash bench/gpu_session.sh  # the same four, bf16, at batch 1 (the UNet 2)
#   STAGE=bert       bash bench/gpu_session.sh  # BERT, the torch.compile backend's tests and the
#                                               # vision builders' test (what `more` ran before)
#
# The kernel stage runs its tests in 8 pytest-xdist workers where xdist imports: prepare the
# wheels with EXTRA_GPU_WHEELS="pytest-xdist execnet" ../shared/tools/prepare-gpu-wheels.
# From the project root on the GPU machine, after `source .whl/install.sh` (docs/gpu.md); the
# vision stages install diffusers from .whl/vision where it does not import (docs/vision.md
# says which wheels; without torchvision the ResNet-50 is Hugging Face's). Logs and result
# files go to $OUT (default ./gpu-session-out), each written as soon as it is made.
# A text model row needs 150-270 s (eager, torch.compile's compile, tgc's first compile with its
# measurements, the second compile), so each model gets its own timeout of MODEL_TIMEOUT
# seconds (default 280) and a stage runs at most two of them. A vision row runs beside eager and
# torch.compile's default mode only (max-autotune's compile of a CNN takes minutes) under
# VISION_TIMEOUT seconds (default 130), four to a stage. Every row is saved after each of its
# steps, and a row cut off by its timeout (SIGTERM; SIGKILL 15 s later) is saved with what it had
# and the step it was in, so a cut row still reports eager and torch.compile.
# Each row also writes the breakdown of the plan that ran (plan-<model>-<dtype>-b<batch>.txt) and
# each text model row its measurement database (--keep-db, measurements-*.sqlite): the next
# session reads what was measured. What comes back of $out is a few files (8), so at the end of a
# stage they go into one archive, $out/plans-<stage>.tar.gz (tar -xzf to read them).
set -uo pipefail
stage=${STAGE:-tests}
out=${OUT:-gpu-session-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# COMMIT first: the device machine's copy of the tree may carry an older .git than the tree
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
model_timeout=${MODEL_TIMEOUT:-280}
vision_timeout=${VISION_TIMEOUT:-130}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
echo "commit $commit" | tee -a "$out/device.txt"

pytest_gpu() {  # name, seconds, files...: pytest without xdist (timed tests share one GPU)
  local name=$1 seconds=$2
  shift 2
  timeout "$seconds" python3 -m pytest -o addopts="" -q -p no:cacheprovider --tb=short -rf "$@" \
    >"$out/$name.txt" 2>&1
  tail -3 "$out/$name.txt"
}

pytest_gpu_parallel() {  # the same for tests that time nothing: 8 workers where xdist imports
  # (.whl holds its wheel when prepared with it): the kernel tests' nvcc builds ran 300 s one
  # after the other on an H200's host and 30 s in 8 workers
  local name=$1 seconds=$2
  shift 2
  local workers=()
  python3 -c 'import xdist' 2>/dev/null && workers=(-n 8)
  pytest_gpu "$name" "$seconds" "${workers[@]}" "$@"
}

attention_sweep() {  # params (sets separated by ;), head dims...: issue 24's grid at each head
  # dim with every set, each head dim's report in $out/<dim>
  local params=$1
  shift
  for d in "$@"; do
    timeout -k 15 170 python3 bench/attention_tc.py --grid --only "$d" --commit "$commit" \
      --out "$out/$d" --params "$params" >>"$out/attention-grid.txt" 2>&1
    echo "attention_tc --grid --only $d --params $params -> exit $?"
  done
}

model() {  # one model row of bench/real_models.py, with its own timeout, its database kept
  timeout -k 15 "$model_timeout" python3 bench/real_models.py --commit "$commit" --out "$out" \
    --keep-db "$@" >"$out/real-models-$(echo "$*" | tr ' ,' '__').txt" 2>&1
  echo "real_models $* -> exit $?"
}

vision_deps() {  # diffusers where it does not import: the wheels of .whl/vision (docs/vision.md)
  python3 -c 'import diffusers' 2>/dev/null && return
  if ls .whl/vision/diffusers-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-vision \
      .whl/vision/*.whl && export PYTHONPATH=/tmp/site-vision${PYTHONPATH:+:$PYTHONPATH}
  fi
  python3 -c 'import diffusers; print("diffusers", diffusers.__version__)' ||
    echo "no diffusers: the unet and vae rows will fail with that"
}

vision() {  # dtype, batch, models...: one vision row each, beside eager and compile's default
  local dtype=$1 batch=$2
  shift 2
  vision_deps
  for name in "$@"; do
    local b=$batch
    # the UNet at batch 2 at least: a guided diffusion step runs a prompt and its empty twin
    [ "$name" = unet ] && [ "$b" = 1 ] && b=2
    timeout -k 15 "$vision_timeout" python3 bench/real_models.py --commit "$commit" \
      --out "$out" --only "$name" --dtypes "$dtype" --batch "$b" --modes eager,default \
      >"$out/real-models-$name-$dtype-b$b.txt" 2>&1
    echo "real_models $name $dtype batch $b -> exit $?"
  done
}

bundle() {  # the rows' plan files, profiles and kept databases as one file of $out (see the top)
  local files
  files=$(cd "$out" && ls plan-*.txt profile-*.txt kernels-*.txt measurements-*.sqlite 2>/dev/null)
  [ -n "$files" ] || return 0
  # shellcheck disable=SC2086  # the names are words: model, dtype, batch
  tar -czf "$out/plans-$stage.tar.gz" -C "$out" $files && (cd "$out" && rm -f $files) &&
    echo "plans-$stage.tar.gz:" $files
}

tests() {
  pytest_gpu route 200 test/test_route_cuda.py test/test_graphs.py test/test_route.py \
    test/test_plan_memory.py test/test_noisy.py test/test_profile_torch_check.py \
    test/test_cuda_source.py
  pytest_gpu planner 200 test/test_planner_cuda.py test/test_standalone.py test/test_write_rows.py
  pytest_gpu dynamo-cuda 200 test/test_dynamo_backend.py test/test_dynamo_generate.py -k cuda
}

kernels() {
  pytest_gpu_parallel attention 300 test/test_attention_tc.py test/test_attention_decode.py \
    test/test_matmul_gemv.py
  pytest_gpu_parallel fusions 200 test/test_cuda.py -k "rotary or group_norm or concat"
  pytest_gpu_parallel epilogues 200 test/test_planner_cuda.py test/test_conv_tc.py \
    -k "cublaslt or conv"
}

grid() {  # extra arguments: more of bench/attention_tc.py's (--only, --params)
  timeout -k 15 560 python3 bench/attention_tc.py --grid --commit "$commit" --out "$out" "$@" \
    >>"$out/attention-grid.txt" 2>&1
  echo "attention_tc --grid $* -> exit $?"
}

case "$stage" in
tests)
  tests
  ;;
validate)
  kernels
  tests
  grid
  grid --only D256 --params "wgmma=false;wgmma=true"
  ;;
cuda)
  pytest_gpu cuda 520 test/test_cuda.py
  ;;
kernels)
  kernels
  ;;
decode)
  # the torch.compile backend's GPU tests first: the decode step's capture is what is timed
  pytest_gpu dynamo-cuda 200 test/test_dynamo_backend.py test/test_dynamo_generate.py -k cuda
  for batch in 1 16; do
    timeout -k 15 200 python3 bench/decode_step.py --commit "$commit" --out "$out" \
      --batch "$batch" --kernels "$out/kernels-b$batch" ${TGC_DB:+--db "$TGC_DB"} \
      >"$out/decode-step-b$batch.txt" 2>&1
    echo "decode_step batch $batch -> exit $?"
    # reduce-overhead apart: its process died of SIGSEGV in bench/generate.py's runs
    timeout -k 15 100 python3 bench/decode_step.py --commit "$commit" --out "$out" \
      --batch "$batch" --modes eager,reduce-overhead >>"$out/decode-step-b$batch.txt" 2>&1
    echo "decode_step batch $batch reduce-overhead -> exit $?"
  done
  tar -czf "$out/kernels-decode.tar.gz" -C "$out" kernels-b1 kernels-b16 2>/dev/null &&
    rm -rf "$out/kernels-b1" "$out/kernels-b16"
  ;;
pdl)
  # a dependent that never saw its wait end would hang: its test alone first, 90 s
  pytest_gpu pdl-first 90 test/test_matmul_gemv.py -k "dependent"
  pytest_gpu_parallel gemv 120 test/test_matmul_gemv.py
  pytest_gpu dynamo-cuda 200 test/test_dynamo_backend.py test/test_dynamo_generate.py -k cuda
  for batch in 1 16; do
    timeout -k 15 230 python3 bench/decode_step.py --commit "$commit" --out "$out" \
      --batch "$batch" --modes eager,tgc,tgc-plain-launch --kernels "$out/kernels-b$batch" \
      --db "$out/measurements-decode.sqlite" >"$out/decode-step-b$batch.txt" 2>&1
    echo "decode_step batch $batch -> exit $?"
  done
  tar -czf "$out/kernels-decode.tar.gz" -C "$out" kernels-b1 kernels-b16 2>/dev/null &&
    rm -rf "$out/kernels-b1" "$out/kernels-b16"
  ;;
attention-store)
  pytest_gpu attention-store-first 60 test/test_attention_tc.py -k "variants and shape59-params59"
  pytest_gpu_parallel attention-store 150 test/test_attention_tc.py -k "wgmma"
  attention_sweep "tma=true;tma=true,tma_store=false" D128 D80 D96 D72
  tar -czf "$out/grids.tar.gz" -C "$out" D128 D80 D96 D72 2>/dev/null && rm -rf "$out"/D128 "$out"/D80 "$out"/D96 "$out"/D72
  ;;
decode-merged)
  pytest_gpu planner 200 test/test_planner_cuda.py test/test_write_rows.py
  pytest_gpu dynamo-cuda 200 test/test_dynamo_backend.py test/test_dynamo_generate.py -k cuda
  for batch in 1 16; do
    timeout -k 15 230 python3 bench/decode_step.py --commit "$commit" --out "$out" \
      --batch "$batch" --modes eager,tgc,tgc-unmerged --kernels "$out/kernels-b$batch" \
      --db "$out/measurements-decode.sqlite" >"$out/decode-step-b$batch.txt" 2>&1
    echo "decode_step batch $batch -> exit $?"
  done
  tar -czf "$out/kernels-decode.tar.gz" -C "$out" kernels-b1 kernels-b16 2>/dev/null &&
    rm -rf "$out/kernels-b1" "$out/kernels-b16"
  ;;
attention-256)
  attention_sweep "tma=true;tma=true,tma_store=true" D256
  ;;
decode-params)
  IFS=';' read -ra sets <<<"${DECODE_PARAMS:-}"
  for i in "${!sets[@]}"; do
    timeout -k 15 120 python3 bench/attention_tc.py --decode --only "${DECODE_ONLY:-B1}" \
      --params "${sets[$i]}" --commit "$commit" --out "$out/decode-set$i" \
      >>"$out/attention-decode.txt" 2>&1
    echo "attention_tc --decode --only ${DECODE_ONLY:-B1} --params '${sets[$i]}' -> exit $?"
  done
  (cd "$out" && tar -czf decode-params.tar.gz decode-set* && rm -rf decode-set*)
  ;;
halves)
  pytest_gpu_parallel halves 150 test/test_matmul_halves.py test/test_matmul_prologue.py \
    test/test_matmul_gemv.py
  timeout -k 15 150 python3 bench/matmul_prologue.py --commit "$commit" --out "$out" \
    >"$out/matmul-prologue.txt" 2>&1
  echo "matmul_prologue -> exit $?"
  timeout -k 15 230 python3 bench/decode_step.py --commit "$commit" --out "$out" --batch 1 \
    --modes eager,tgc-unhalved,tgc --kernels "$out/kernels-b1" \
    --db "$out/measurements-decode.sqlite" >"$out/decode-step-b1.txt" 2>&1
  echo "decode_step batch 1 -> exit $?"
  tar -czf "$out/kernels-decode.tar.gz" -C "$out" kernels-b1 2>/dev/null && rm -rf "$out/kernels-b1"
  ;;
tma)
  pytest_gpu tma-first 60 test/test_matmul_wgmma.py -k "float64 and params5"
  pytest_gpu wgmma 120 test/test_matmul_wgmma.py test/test_standalone.py \
    test/test_matmul_prologue.py
  timeout -k 15 200 python3 bench/matmul_wgmma.py --commit "$commit" --out "$out" --no-compile \
    >"$out/matmul-wgmma.txt" 2>&1
  echo "matmul_wgmma -> exit $?"
  timeout -k 15 150 python3 bench/matmul_prologue.py --commit "$commit" --out "$out" \
    >"$out/matmul-prologue.txt" 2>&1
  echo "matmul_prologue -> exit $?"
  ;;
persistent)
  pytest_gpu_parallel persistent 150 test/test_attention_tc.py -k "wgmma"
  attention_sweep "persistent=false;persistent=true" D128 D64 D80
  ;;
attention-tma)
  # one case first: a deadlocked kernel costs its 60 s, not the stage
  pytest_gpu attention-tma-first 60 test/test_attention_tc.py -k "variants and shape39-params39"
  pytest_gpu_parallel attention-tma 150 test/test_attention_tc.py -k "wgmma"
  attention_sweep "tma=false;tma=true" D128 D64 D80
  ;;
attention-merge)
  # the merged query tiles (merge_tiles): one of its cases first (a deadlock costs 60 s)
  pytest_gpu attention-merge-first 60 test/test_attention_tc.py -k "variants and shape49-params49"
  pytest_gpu_parallel attention-merge 150 test/test_attention_tc.py -k "wgmma or tma"
  attention_sweep "tma=true;tma=true,merge_tiles=true" D128 D64 D80 D256
  ;;
gemv)
  pytest_gpu_parallel gemv 120 test/test_matmul_gemv.py
  timeout -k 15 300 python3 bench/matmul_gemv.py --commit "$commit" --out "$out" --variants \
    >"$out/matmul-gemv.txt" 2>&1
  echo "matmul_gemv --variants -> exit $?"
  ;;
models)
  model --only gpt2 --dtypes bf16 --profile --modes eager,default,reduce-overhead
  model --only llama --dtypes bf16 --profile --modes eager,default,reduce-overhead
  ;;
generate | generate16)
  batch=1
  [ "$stage" = generate16 ] && batch=16
  # tgc's measurements in a file that comes back in the stage's archive: carried into the next
  # call (TGC_DB, a path in the tree), tgc's first use there measures only what is new
  if [ -n "${TGC_DB:-}" ]; then cp "$TGC_DB" "$out/measurements-generate.sqlite"; fi
  # 530 s: with the install before and the archive after, within a ten-minute device call
  timeout -k 15 530 python3 bench/generate.py --commit "$commit" --out "$out" \
    --batches "$batch" --modes eager,tgc,hf-compile,default,reduce-overhead --profile "$out" \
    --db "$out/measurements-generate.sqlite" >"$out/generate-b$batch.txt" 2>&1
  echo "generate batch $batch -> exit $?"
  ;;
first-call)
  timeout -k 15 530 python3 bench/generate.py --commit "$commit" --out "$out" --batches 1 \
    --modes tgc --profile "$out" --profile-first-call "$out" \
    --db "$out/measurements-first-call.sqlite" >"$out/generate-first-call.txt" 2>&1
  echo "generate first call -> exit $?"
  ;;
backend)
  model --only gpt2 --dtypes bf16 --modes eager,default,tgc-backend
  model --only llama --dtypes bf16 --modes eager,default,tgc-backend
  ;;
backend-bert)
  model --only bert --dtypes bf16 --modes eager,default,tgc-backend
  ;;
attention)
  timeout -k 15 250 python3 bench/attention_tc.py --commit "$commit" --out "$out" \
    >"$out/attention-tc.txt" 2>&1
  echo "attention_tc -> exit $?"
  timeout -k 15 250 python3 bench/attention_tc.py --decode --commit "$commit" --out "$out" \
    >"$out/attention-decode.txt" 2>&1
  echo "attention_tc --decode -> exit $?"
  ;;
grid)
  grid
  ;;
autotune)
  model --only gpt2 --dtypes bf16 --modes max-autotune-no-cudagraphs
  model --only llama --dtypes bf16 --modes max-autotune-no-cudagraphs
  ;;
more)
  vision bf16 8 resnet50 vit unet vae
  ;;
vision-f32)
  vision f32 8 resnet50 vit unet vae
  ;;
vision-b1)
  vision bf16 1 resnet50 vit unet vae
  ;;
bert)
  model --only bert --dtypes bf16
  pytest_gpu dynamo 240 test/test_dynamo_backend.py test/test_hl_vision.py \
    test/test_bench_real_models.py
  ;;
*)
  echo "STAGE must be tests, validate, cuda, kernels, pdl, attention-store, decode-merged, attention-256, decode-params, halves, tma, persistent, attention-tma, attention-merge, gemv, decode, models, backend, backend-bert, attention," \
    "grid, autotune, generate, first-call, generate16, more, vision-f32, vision-b1 or bert" >&2
  exit 2
  ;;
esac
bundle
