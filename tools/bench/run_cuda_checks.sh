#!/usr/bin/env bash
# The checks that need a CUDA GPU, for a machine that has one (CI and the development machines have none, so
# these tests are skipped there), then the GPU search benchmark (tools/bench/bench_gpu_search.py).
#
#   bash tools/bench/run_cuda_checks.sh OUT_DIR [BENCH_LM_DIR]   (from the repository root; asrkit importable)
#
# OUT_DIR gets cuda_tests.log, bench_gpu.md and bench_gpu.log. BENCH_LM_DIR is what tools/bench/make_bench_lm.py
# writes with --order 3 (default .bench_lm). On a machine without asrkit's dependencies, first make a
# self-contained tree with tools/bench/pack_gpu_tree.sh and run this script from inside it.
# TESTS_TIMEOUT / BENCH_TIMEOUT (seconds; defaults 240 and 330) bound the two parts, to fit a short GPU lease.
# Exit status: the tests'.
set -euo pipefail
out="${1:?usage: tools/bench/run_cuda_checks.sh OUT_DIR [BENCH_LM_DIR]}"
lm_dir="${2:-.bench_lm}"
mkdir -p "$out"
python3 - <<'PY'
import torch
assert torch.cuda.is_available(), "run_cuda_checks.sh: no CUDA device is visible"
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
PY
python3 -c "from asrkit.search import native_build; print('C++ search loop:', native_build.build())" || true

# Every test file that holds a CUDA check, i.e. asks torch.cuda.is_available() (their CPU tests run too:
# another machine's kernels), on several workers when pytest-xdist is there.
mapfile -t files < <(grep -rl --include='test_*.py' 'cuda.is_available()' tests | sort)
echo "test files with CUDA checks: ${files[*]}"
workers=()
python3 -c "import xdist" 2>/dev/null && workers=(-n 6)
set +e
timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -rs -p no:cacheprovider "${workers[@]}" "${files[@]}" 2>&1 \
  | tee "$out/cuda_tests.log" | tail -25
rc=${PIPESTATUS[0]}
timeout "${BENCH_TIMEOUT:-330}" python3 tools/bench/bench_gpu_search.py --lm-dir "$lm_dir" --out "$out/bench_gpu.md" 2>&1 \
  | tee "$out/bench_gpu.log" | tail -60
set -e
exit "$rc"
