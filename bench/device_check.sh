#!/usr/bin/env bash
# GPU verification on a lent GPU machine, in two calls of the device tool (a call carries at
# most 64 MiB, so the 98 MB default model travels in two halves, split into .models/a and
# .models/b with `split -b 50000000`; the gguf wheel travels in .whl).
#   phase 1 (carry .whl .models/a): the GPU tests on random-init models at real shapes
#   phase 2 (carry .whl .models/b): real weights: GPU tests, kog generate, drafted passes, kog bench (and --drafts 5)
#   phase variants (carry .whl): timing knobs of the current tree, one call: for each of $MODELS (comma-separated),
#     greedy tokens of each of $VARIANTS against the default (bench/variant_tokens.py, prompts $CONTEXTS), then
#     the default and the variants timed twice in alternation at each of $CONTEXTS (bench/decode_breakdown.py)
#   phase ab (carry .whl .bench): a kernel change against a baseline, one call: latency probes, the GPU
#     tests, then bench/decode_breakdown.py timing $VARIANTS (default baseline,full) beside the
#     kernels in .bench/base/kernels (AB_ONLY=1: the timing alone), made beforehand with
#     `mkdir -p .bench/base && git archive main kernels | tar -x -C .bench/base`
#   phase knob (carry .whl): a build knob's new default checked on the GPU before it is flipped: KNOB=KOG_NAME=VALUE
#     set as the default in the device's copy of kernels/decode_common.cuh, then the GPU tests of $MODELS
#     (KOG_TEST_MODELS) matching $TESTS (pytest -k; default: all but the real weights')
#   phase replies (carry .whl .models/b, after any phase that carried .models/a): the real weights' drafted replies
#     (bench/lookup_acceptance.py, switching rules $RULES, default 4:4) of the default build, then of the build with
#     $DEFINES (KOG_X=N ..., space-separated) where given
# Any phase stages the model's halves it carries; the machine keeps them while it stays warm.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .models/site .whl/*.whl \
  && export PYTHONPATH=$PWD/.models/site:$PWD || exit 1
export PYTHONUNBUFFERED=1 KOG_HOME=${KOG_HOME:-$PWD/.models/kog-home} OUT=${OUT:-$PWD/.models/out} COLUMNS=200
mkdir -p "$OUT" "$KOG_HOME/parts"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
KOG="python3 -m kogcli"
for half in .models/a .models/b; do
  if [ -d "$half" ]; then cp "$half"/* "$KOG_HOME/parts/"; fi
done
default_model() {  # the default model from its two staged halves, where the registry looks for it
  local model=$KOG_HOME/cache/models/smollm2-135m-instruct
  [ -f "$KOG_HOME/parts/gguf.part-aa" ] && [ -f "$KOG_HOME/parts/gguf.part-ab" ] \
    || { echo "the default model's halves are not both staged (.models/a, then .models/b)"; return 1; }
  mkdir -p "$model" && cat "$KOG_HOME"/parts/gguf.part-* > "$model/SmolLM2-135M-Instruct.Q4_1.gguf"
  sha256sum "$model/SmolLM2-135M-Instruct.Q4_1.gguf"
}
case "$1" in
1)
  KOG_TEST_MODELS=${KOG_TEST_MODELS:-smollm2-135m,qwen3-1.7b} \
    timeout 300 python3 -m pytest -q -m gpu tests/test_cuda_backend.py -k "not real_default" -rfEs 2>&1 | tee "$OUT/tests.log"
  ;;
2)
  default_model || exit 1
  timeout 120 python3 -m pytest -q -m gpu tests/test_cuda_backend.py -k real_default -rfEs -s 2>&1 | tee "$OUT/real.log"
  timeout 60 $KOG generate "Write a Python function that reverses a list." --device cuda --max-tokens 96
  timeout 90 $KOG bench --quick --drafts 5 --device cuda --json "$OUT/quick.json" 2>&1 | tee "$OUT/quick.log"
  timeout 330 $KOG bench --device cuda --context 32 --tokens 256 --runs 5 --model llama-3.2-1b-instruct \
    --model qwen2.5-coder-1.5b-instruct --model smollm2-135m-instruct --json "$OUT/bench.json" --plot "$OUT/bench.png" \
    2>&1 | tee "$OUT/bench.log"
  timeout 120 $KOG bench --device cuda --context 4096 --tokens 64 --runs 3 --no-peers --model llama-3.2-1b-instruct \
    2>&1 | tee "$OUT/ttft.log"
  # (last: the table's runs come first within the call's time)
  timeout 150 python3 bench/lookup_acceptance.py --device cuda --positions 5 --drafts 4 2>&1 | tee "$OUT/drafts.log"
  ;;
variants)
  : "${MODELS:?MODELS=model,...}" "${VARIANTS:?VARIANTS=variant,...}"
  CONTEXTS=${CONTEXTS:-32,160}
  for model in ${MODELS//,/ }; do
    if ! timeout 200 python3 bench/variant_tokens.py --model "$model" --variants "$VARIANTS" --contexts "$CONTEXTS" 2>&1 \
      | grep -v Warn | tee -a "$OUT/tokens.log"; then
      echo "$model: a variant's tokens differ from the default's (or the check failed): not timed"
      continue
    fi
    for ctx in ${CONTEXTS//,/ }; do
      timeout 200 python3 bench/decode_breakdown.py --models "$model" --trace none --context "$ctx" \
        --variants "full,$VARIANTS,full,$VARIANTS" 2>&1 | grep -v Warn | grep "^$model" | tee -a "$OUT/timing.log"
    done
  done
  ;;
ab)
  if [ -z "$AB_ONLY" ]; then  # AB_ONLY=1: the timing alone (a second call for more variants)
    timeout 120 python3 bench/sync_probe.py 2>&1 | tee "$OUT/probe.log"
    KOG_TEST_MODELS=${KOG_TEST_MODELS:-smollm2-135m,llama-3.2-1b,qwen2.5-1.5b,qwen3-1.7b} \
      timeout 240 python3 -m pytest -q -x -m gpu tests/test_cuda_backend.py -k "not real_default" -rfEs 2>&1 | tee "$OUT/tests.log"
  fi
  timeout "${AB_TIMEOUT:-300}" python3 bench/decode_breakdown.py --models "${AB_MODELS:-smollm2-135m,llama-3.2-1b}" \
    --trace "${AB_TRACE:-none}" --baseline .bench/base/kernels --variants "${VARIANTS:-baseline,full}" 2>&1 \
    | grep -v Warn | tee "$OUT/ab.log"
  ;;
replies)
  default_model || exit 1
  with=()
  for d in $DEFINES; do with+=(--define "$d"); done
  for build in default ${DEFINES:+defines}; do
    extra=(); [ "$build" = defines ] && extra=("${with[@]}")
    echo "=== the $build build ${extra[*]}" | tee -a "$OUT/replies.log"
    timeout 270 python3 bench/lookup_acceptance.py --device cuda --positions 5 --drafts 4 --rules "${RULES:-4:4}" \
      "${extra[@]}" 2>&1 | tee -a "$OUT/replies.log"
  done
  ;;
knob)
  : "${KNOB:?KNOB=KOG_NAME=VALUE}" "${MODELS:?MODELS=model,...}"
  name=${KNOB%%=*} value=${KNOB#*=}
  sed -i "s/^#define $name -\?[0-9]\+\b/#define $name $value/" kernels/decode_common.cuh
  grep -q "^#define $name $value\b" kernels/decode_common.cuh || { echo "kernels/decode_common.cuh: no default of $name set"; exit 1; }
  KOG_TEST_MODELS=$MODELS timeout "${KNOB_TIMEOUT:-300}" python3 -m pytest -q -m gpu tests/test_cuda_backend.py \
    -k "${TESTS:-not real}" -rfEs -s 2>&1 | tee "$OUT/knob.log"
  ;;
esac
