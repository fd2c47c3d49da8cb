#!/usr/bin/env bash
# Mini recipe: synthesize English speech with espeak-ng, train a tiny CTC Transformer and a character LSTM LM,
# decode (greedy, and CTC prefix beam search with the LM fused) and score.
# This is what `make demo` runs; it needs no downloads. The whole recipe took about 9.5 min on a quiet 2-core CPU
# (acoustic training 5 min, LM 2.5 min; measured: see README, Results).
#
# Usage: recipes/mini/run.sh [--stage N] [--stop-stage N] [--config conf/tiny_ctc.yaml] [--exp exp/tiny_ctc]
#                            [--lm-config conf/lm_lstm_small.yaml] [--decode-config conf/decode_ctc_prefix_lm.yaml]
#                            [--workdir DIR (default: this folder; data/ and exp/ go there)]
#                            [--train-opts "--set key=value ..."] [--lm-opts "--set key=value ..."]
#   stage 0: synthesize data/{train,dev,test}        stage 4: train the LM on the training transcripts
#   stage 1: validate the data dirs                  stage 5: choose LM weight and length bonus on data/dev
#   stage 2: tokenizer + global CMVN stats           stage 6: decode the test split: greedy, then with the LM
#   stage 3: train                                   stage 7: score both and print the WER report
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

stage=0
workdir="$here"
stop_stage=100
config="$root/conf/tiny_ctc.yaml"
exp=exp/tiny_ctc
num_train=1600
num_dev=100
num_test=100
num_test_unseen=100   # data/test_unseen: flite voices no training split has (0: none)
snr_db=25
seed=1
jobs=2
train_opts=""
lm_opts=""
lm_config="$root/conf/lm_lstm_small.yaml"
lm_dir=exp/lm_lstm
decode_config="$root/conf/decode_ctc_prefix_lm.yaml"
lm_weights="0.4 0.8 1.2"    # the grid searched on data/dev in stage 5
length_bonuses="1.5 2.5"
. "$root/tools/parse_options.sh"
mkdir -p "$workdir"
cd "$workdir"

# One BLAS thread per process: with the data-loader worker on the other core this is the fastest setting
# on 2 cores, and it does not collapse when something else is running (2 threads then run 4x slower).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

log() { echo "$(date '+%Y-%m-%d %H:%M:%S') [stage $1] ${*:2}"; }
run_stage() { [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; }

if run_stage 0; then
  log 0 "synthesizing speech into data/ (train $num_train, dev $num_dev, test $num_test utterances)"
  python "$root/tools/make_synthetic_corpus.py" --out data --num-train "$num_train" --num-dev "$num_dev" \
    --num-test "$num_test" --num-test-unseen "$num_test_unseen" --seed "$seed" --snr-db "$snr_db" --jobs "$jobs"
fi

if run_stage 1; then
  for split in train dev test test_unseen; do
    [ "$split" = test_unseen ] && [ ! -d data/test_unseen ] && continue
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
  log 4 "training the LM $lm_config into $lm_dir (dev perplexity on data/dev)"
  # shellcheck disable=SC2086
  asrkit train-lm --config "$lm_config" --text data/train/text --dev-text data/dev/text \
    --tokenizer data/lang/tokenizer.json --out "$lm_dir" $lm_opts
fi

if run_stage 5; then
  log 5 "choosing the LM weight ($lm_weights) and length bonus ($length_bonuses) on data/dev"
  # shellcheck disable=SC2086
  asrkit tune-fusion --model "$exp" --data data/dev --out "$exp/tune_dev" --decode-config "$decode_config" \
    --lm "$lm_dir" --lm-weights $lm_weights --length-bonuses $length_bonuses
fi

if run_stage 6; then
  log 6 "decoding data/test: greedy CTC"
  asrkit decode --model "$exp" --data data/test --out "$exp/decode_test"
  log 6 "decoding data/test with $exp/tune_dev/decode.yaml (the LM, weights chosen on dev)"
  asrkit decode --model "$exp" --data data/test --out "$exp/decode_test_lm" --decode-config "$exp/tune_dev/decode.yaml"
fi

if run_stage 7; then
  log 7 "scoring"
  for d in decode_test decode_test_lm; do
    echo "$d: $(asrkit score --ref data/test/text --hyp "$exp/$d/text" --out "$exp/$d/scoring" | head -n 1)"
  done
  asrkit score --ref data/test/text --hyp "$exp/decode_test_lm/text" --utt2spk data/test/utt2spk \
    --out "$exp/decode_test_lm/scoring"
  echo "alignments: $PWD/$exp/decode_test_lm/scoring/result.pra"
  head -n 30 "$exp/decode_test_lm/scoring/result.pra"
fi
