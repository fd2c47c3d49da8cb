#!/usr/bin/env bash
# A self-contained copy of the committed tree for a GPU machine that has PyTorch but no network: the sources
# (git archive HEAD), the benchmark's tokenizers and word 3-gram (tools/bench/make_bench_lm.py), and wheels of
# asrkit's dependencies that such an image lacks, for Python 3.12 on x86-64.
#
#   bash tools/bench/pack_gpu_tree.sh DIR        (here, with network access to the package index)
#   cd DIR && bash gpu_run.sh                    (there: installs the wheels into /tmp/site, then
#                                                 tools/bench/run_cuda_checks.sh $OUT .bench_lm)
#   cd DIR && bash gpu_run.sh --dry-run          (anywhere: the same steps on the CPU at tiny sizes, no CUDA tests)
set -euo pipefail
dir="${1:?usage: tools/bench/pack_gpu_tree.sh DIR}"
py="${PYTHON:-python3}"
rm -rf "$dir" && mkdir -p "$dir"
git archive HEAD | tar -x -C "$dir"
"$py" tools/bench/make_bench_lm.py --out .bench_lm --order 3
mkdir -p "$dir/.bench_lm/char" "$dir/.bench_lm/bpe500"
cp .bench_lm/char/tokenizer.json "$dir/.bench_lm/char/"
cp .bench_lm/bpe500/tokenizer.json "$dir/.bench_lm/bpe500/"
cp .bench_lm/heldout.txt .bench_lm/word_3gram.arpa "$dir/.bench_lm/"
# What the GPU image (PyTorch, torchaudio, numpy, sentencepiece, pyyaml, tqdm, tensorboard, pytest, xdist) lacks.
wheels=(jiwer==4.0.0 rapidfuzz==3.14.6 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 librosa==0.11.0
        audioread==3.1.0 soxr==1.1.0 pooch==1.9.0 platformdirs==4.14.8 decorator==5.3.1)
for w in "${wheels[@]}"; do
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dir/.whl" "$w"
done
cat > "$dir/gpu_run.sh" <<'RUN'
set -u
dry=()
[[ "${1:-}" == "--dry-run" ]] && dry=(--dry-run)
python3 -c "import torch" || { echo "gpu_run.sh: python3 has no torch" >&2; exit 1; }
# The wheels only where the packages are missing (they are built for Python 3.12).
if ! python3 -c "import jiwer, soundfile, librosa" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; fi
bash tools/bench/run_cuda_checks.sh "${dry[@]}" "${OUT:-gpu_out}" .bench_lm
RUN
du -sh "$dir"
