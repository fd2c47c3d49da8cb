#!/usr/bin/env bash
# The checks that need a CUDA GPU, for a machine that has one (CI and the development machines have none, so
# these tests are skipped there), then the GPU rows of the CTC prefix search benchmark.
#
#   bash tools/bench/run_cuda_checks.sh OUT_DIR [BENCH_LM_DIR]   (from the repository root; asrkit importable)
#
# OUT_DIR gets cuda_tests.log and bench_*.md/.log. BENCH_LM_DIR is what tools/bench/make_bench_lm.py writes (default
# exp/bench_decode, orders 4 and 3); without it the benchmark runs its random-vocabulary rows only.
# Exit status: the tests'.
set -euo pipefail
out="${1:?usage: tools/bench/run_cuda_checks.sh OUT_DIR [BENCH_LM_DIR]}"
lm_dir="${2:-exp/bench_decode}"
mkdir -p "$out"
python - <<'EOF'
import torch
assert torch.cuda.is_available(), "run_cuda_checks.sh: no CUDA device is visible"
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
EOF

# Every test file that holds a CUDA check, i.e. asks torch.cuda.is_available() (their CPU tests run too:
# another machine's kernels).
mapfile -t files < <(grep -rl --include='test_*.py' 'cuda.is_available()' tests | sort)
echo "test files with CUDA checks: ${files[*]}"
set +e
python -m pytest -q -rs -p no:cacheprovider "${files[@]}" 2>&1 | tee "$out/cuda_tests.log"
rc=${PIPESTATUS[0]}
set -e

# The benchmark: the same inputs on the GPU (eager torch loop, then one CUDA graph per batch, at docs/benchmarks.md's
# 32 utterances and at 512) and on this machine's CPU (the C++ loop, one thread) for the ratio. Tables:
# bench_cuda.md (batch 32), bench_cuda512.md, bench_cpu.md; every run's output in bench.log.
export OMP_NUM_THREADS=1
texts=""
[ -d "$lm_dir" ] && texts="char bpe500"
bench() {  # TABLE ARGS...
  local table=$1; shift
  python tools/bench/bench_decode.py --beams 10 50 --threads 1 --decoders prefix --lm-dir "$lm_dir" --repeats 3 \
    --markdown "$out/bench_$table.md" "$@" 2>&1 | tee -a "$out/bench.log"
}
for run in eager graph graph512 cpu; do
  case $run in
    eager) table=cuda; opts=(--device cuda --no-reference) ;;
    graph) table=cuda; opts=(--device cuda --cuda-graph) ;;  # with the CPU's exact search as the reference
    graph512) table=cuda512; opts=(--device cuda --cuda-graph --batch 512 --no-reference) ;;
    cpu) table=cpu; opts=(--no-reference) ;;
  esac
  bench "$table" --vocabs 29 500 5000 $texts --lms none token --order 4 "${opts[@]}"
  if [ -n "$texts" ]; then
    bench "$table" --vocabs $texts --lms word --order 3 --unk-offset -10 "${opts[@]}"
  fi
done
exit "$rc"
