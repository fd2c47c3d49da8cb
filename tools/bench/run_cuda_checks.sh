#!/usr/bin/env bash
# The checks that need a CUDA GPU, for a machine that has one (CI and the development machines have none, so
# these tests are skipped there), and the GPU search benchmark (tools/bench/bench_gpu_search.py).
#
#   bash tools/bench/run_cuda_checks.sh [--dry-run] OUT_DIR [BENCH_LM_DIR]   (from the repository root; asrkit
#                                                                            importable)
#
# OUT_DIR gets, in this order: fused_tests.log and bench_search.md (the fused kernels' tests, then the search-alone
# section, about 2 minutes: issue 33's figure first, in case the lease ends early), cuda_tests.log (every other
# CUDA check), bench_gpu.md and bench_gpu.log (the LM and end-to-end sections). BENCH_LM_DIR is what
# tools/bench/make_bench_lm.py writes with --order 3 (default .bench_lm). On a machine without asrkit's
# dependencies, first make a self-contained tree with tools/bench/pack_gpu_tree.sh and run this script from inside
# it. TESTS_TIMEOUT / BENCH_TIMEOUT (seconds; defaults 240 and 330) bound the tests and the benchmark's sections.
# --dry-run: on a machine without CUDA, the same steps at tiny sizes on the CPU (the Triton kernels under the
# interpreter; no CUDA tests): checks that the script and the benchmark run, measures nothing.
# Exit status: the tests' (1 without a CUDA device, outside --dry-run).
set -euo pipefail
dry=0
if [[ "${1:-}" == "--dry-run" ]]; then dry=1; shift; fi
out="${1:?usage: tools/bench/run_cuda_checks.sh [--dry-run] OUT_DIR [BENCH_LM_DIR]}"
lm_dir="${2:-.bench_lm}"
mkdir -p "$out"
bench=(python3 tools/bench/bench_gpu_search.py --lm-dir "$lm_dir")
if [[ $dry == 1 ]]; then
  export TRITON_INTERPRET=1  # the fused rows run their kernels under Triton's interpreter
  bench+=(--device cpu --frames 12 --vocabs 29 --batches 2 --lm-batches 2 --e2e-batches 1 --repeats 1
          --config conf/tiny_ctc.yaml)
  echo "dry run: no CUDA tests; the benchmark at tiny sizes on the CPU"
else
  python3 -c 'import sys, torch
sys.exit(0 if torch.cuda.is_available() else "run_cuda_checks.sh: no CUDA device is visible (--dry-run checks the steps on the CPU)")'
  python3 -c 'import torch; print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)'
fi
python3 -c "from asrkit.search import native_build; print('C++ search loop:', native_build.build())" || true
[[ -f "$lm_dir/word_3gram.arpa" ]] || { echo "run_cuda_checks.sh: $lm_dir/word_3gram.arpa is missing (tools/bench/make_bench_lm.py --out $lm_dir --order 3)" >&2; exit 1; }

# Every test file that holds a CUDA check, i.e. asks torch.cuda.is_available() (their CPU tests run too:
# another machine's kernels), on several workers when pytest-xdist is there.
mapfile -t files < <(grep -rl --include='test_*.py' 'cuda.is_available()' tests | sort)
echo "test files with CUDA checks: ${files[*]}"
workers=()
python3 -c "import xdist" 2>/dev/null && workers=(-n 6)
rc=0
set +e
# 1. The fused kernels compiled and checked against the torch loop, then the search alone (issue 33's figure).
if [[ $dry == 0 ]]; then
  timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -rs -p no:cacheprovider tests/search/test_fused_step.py 2>&1 \
    | tee "$out/fused_tests.log" | tail -5
  rc=${PIPESTATUS[0]}
fi
timeout "${BENCH_TIMEOUT:-330}" "${bench[@]}" --sections search --out "$out/bench_search.md" 2>&1 \
  | tee "$out/bench_search.log" | tail -30
brc=${PIPESTATUS[0]}
# 2. Every other CUDA check.
if [[ $dry == 0 ]]; then
  rest=()
  for f in "${files[@]}"; do [[ "$f" == tests/search/test_fused_step.py ]] || rest+=("$f"); done
  timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -rs -p no:cacheprovider "${workers[@]}" "${rest[@]}" 2>&1 \
    | tee "$out/cuda_tests.log" | tail -25
  trc=${PIPESTATUS[0]}
  [[ $rc != 0 ]] || rc=$trc
fi
# 3. The search with the word 3-gram, and end to end.
timeout "${BENCH_TIMEOUT:-330}" "${bench[@]}" --sections lm e2e --out "$out/bench_gpu.md" 2>&1 \
  | tee "$out/bench_gpu.log" | tail -40
brc2=${PIPESTATUS[0]}
set -e
if [[ $dry == 1 ]]; then
  echo "dry run: benchmark exit codes $brc (search) and $brc2 (lm, e2e)"
  [[ $brc == 0 && $brc2 == 0 ]] || exit 1
fi
exit "$rc"
