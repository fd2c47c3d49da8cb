#!/usr/bin/env bash
# Mini recipe: synthesize English speech with espeak-ng, train a tiny CTC Transformer, decode and score.
# This is what `make demo` runs; it needs no downloads. Training takes about 9 minutes on a lightly loaded
# 2-core CPU (measured: see README, Results).
#
# Usage: recipes/mini/run.sh [--stage N] [--stop-stage N] [--config conf/tiny_ctc.yaml] [--exp exp/tiny_ctc]
#   stage 0: synthesize data/{train,dev,test}        stage 3: train
#   stage 1: validate the data dirs                  stage 4: decode the test split
#   stage 2: tokenizer + global CMVN stats           stage 5: score and print the WER report
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

stage=0
stop_stage=100
config="$root/conf/tiny_ctc.yaml"
exp=exp/tiny_ctc
num_train=1600
num_dev=100
num_test=100
snr_db=25
seed=1
jobs=2
train_opts=""
. "$root/tools/parse_options.sh"

# One BLAS thread per process: with the data-loader worker on the other core this is the fastest setting
# on 2 cores, and it does not collapse when something else is running (2 threads then run 4x slower).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

log() { echo "$(date '+%Y-%m-%d %H:%M:%S') [stage $1] ${*:2}"; }
run_stage() { [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; }

if run_stage 0; then
  log 0 "synthesizing speech into data/ (train $num_train, dev $num_dev, test $num_test utterances)"
  python "$root/tools/make_synthetic_corpus.py" --out data --num-train "$num_train" --num-dev "$num_dev" \
    --num-test "$num_test" --seed "$seed" --snr-db "$snr_db" --jobs "$jobs"
fi

if run_stage 1; then
  for split in train dev test; do
    log 1 "validating data/$split"
    python "$root/tools/validate_data_dir.py" "data/$split"
  done
fi

if run_stage 2; then
  mkdir -p data/lang
  log 2 "training the character tokenizer"
  asrkit train-tokenizer --text data/train/text --model-type char data/lang/tokenizer.json
  log 2 "computing global CMVN stats"
  asrkit compute-cmvn --config "$config" --max-utts 500 --no-progress data/train data/lang/cmvn.json
fi

if run_stage 3; then
  log 3 "training $config into $exp"
  # shellcheck disable=SC2086
  asrkit train --config "$config" --train-data data/train --valid-data data/dev --out "$exp" \
    --tokenizer data/lang/tokenizer.json --cmvn data/lang/cmvn.json $train_opts
fi

if run_stage 4; then
  log 4 "decoding data/test"
  asrkit decode --model "$exp" --data data/test --out "$exp/decode_test"
fi

if run_stage 5; then
  log 5 "scoring"
  asrkit score --ref data/test/text --hyp "$exp/decode_test/text" --utt2spk data/test/utt2spk \
    --out "$exp/decode_test/scoring"
  echo "alignments: $here/$exp/decode_test/scoring/result.pra"
  head -n 30 "$exp/decode_test/scoring/result.pra"
fi
