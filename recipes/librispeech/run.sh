#!/usr/bin/env bash
# LibriSpeech recipe: Kaldi data dirs -> BPE tokenizer + CMVN -> Transformer (joint CTC/attention) -> average
# -> language models -> decode -> score.
#
# Usage: recipes/librispeech/run.sh --corpus-dir /path/to/LibriSpeech [--stage N] [--stop-stage N]
#            [--config conf/transformer.yaml] [--exp exp/transformer] [--train-sets "train-clean-100 ..."]
#            [--decode-config conf/decode_joint.yaml] [--lm-text FILE] [--lm none|ngram|neural]
#   stage 0: download (only with --download true) ; stage 1: data dirs + utt2dur + validation
#   stage 2: BPE tokenizer + global CMVN ; stage 3: train ; stage 4: average the best checkpoints
#   stage 5: language model (a word 4-gram through KenLM, or a Transformer LM) on --lm-text
#            (default: the training transcripts; LibriSpeech's 800M-word LM corpus is better)
#   stage 6: LM weight/length bonus chosen on --valid-set, then decode dev/test sets with --decode-config
#            (+ the LM at those weights) ; stage 7: score
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"
. ./path.sh

stage=1
stop_stage=100
corpus_dir=
download=false
train_sets="train-clean-100 train-clean-360 train-other-500"
eval_sets="dev-clean dev-other test-clean test-other"
valid_set=dev-clean
config="$root/conf/transformer.yaml"
exp=exp/transformer
bpe_size=5000
average_best=10
decode_config="$root/conf/decode_joint.yaml"
lm=ngram            # none | ngram (word 4-gram, fused at word boundaries) | neural (conf/lm_transformer.yaml)
lm_text=            # plain text, one sentence per line; empty: the training transcripts
lm_order=4
lm_config="$root/conf/lm_transformer.yaml"
lm_weights="0.2 0.4 0.6"   # grid searched on --valid-set in stage 6 (asrkit tune-fusion)
length_bonuses="0 1"
nj=8
. "$root/tools/parse_options.sh"

[ -n "$corpus_dir" ] || { echo "$0: --corpus-dir is required (the folder holding LibriSpeech/)" >&2; exit 1; }
log() { echo "$(date '+%Y-%m-%d %H:%M:%S') [stage $1] ${*:2}"; }
run_stage() { [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; }
dir_of() { echo "data/${1//-/_}"; }

if run_stage 0 && [ "$download" = true ]; then
  for part in $train_sets $eval_sets; do
    log 0 "downloading $part into $corpus_dir"
    local/download_and_untar.sh "$corpus_dir" "$part"
  done
fi

if run_stage 1; then
  for part in $train_sets $eval_sets; do
    log 1 "preparing $(dir_of "$part") from $corpus_dir/LibriSpeech/$part"
    python local/data_prep.py "$corpus_dir/LibriSpeech/$part" "$(dir_of "$part")"
    python "$root/tools/compute_utt2dur.py" --jobs "$nj" "$(dir_of "$part")"
    python "$root/tools/validate_data_dir.py" "$(dir_of "$part")"
  done
  dirs=()
  for part in $train_sets; do dirs+=("$(dir_of "$part")"); done
  log 1 "combining ${dirs[*]} into data/train"
  python "$root/tools/combine_data.py" data/train "${dirs[@]}"
fi

if run_stage 2; then
  mkdir -p data/lang
  log 2 "training a $bpe_size-piece BPE tokenizer"
  asrkit train-tokenizer --text data/train/text --model-type bpe --vocab-size "$bpe_size" data/lang/tokenizer.json
  log 2 "computing global CMVN stats on 20000 training utterances"
  asrkit compute-cmvn --config "$config" --max-utts 20000 data/train data/lang/cmvn.json
fi

if run_stage 3; then
  log 3 "training $config into $exp (resumes if interrupted)"
  $train_cmd "$(command -v asrkit)" train --config "$config" --train-data data/train --valid-data "$(dir_of "$valid_set")" \
    --out "$exp" --tokenizer data/lang/tokenizer.json --cmvn data/lang/cmvn.json
fi

if run_stage 4; then
  log 4 "averaging the $average_best best checkpoints"
  asrkit average --model "$exp" --best "$average_best"
fi

if run_stage 5 && [ "$lm" != none ]; then
  mkdir -p exp/lm
  text_opts=(--text data/train/text)
  dev_text="$(dir_of "$valid_set")/text"
  if [ -n "$lm_text" ]; then  # plain text: the dev transcripts lose their utterance ids to match
    text_opts=(--text "$lm_text" --plain-text)
    cut -d' ' -f2- "$dev_text" > exp/lm/dev.txt
    dev_text=exp/lm/dev.txt
  fi
  if [ "$lm" = ngram ]; then
    log 5 "training a word $lm_order-gram on ${lm_text:-data/train/text} (KenLM lmplz; tools/install_kenlm.sh builds it)"
    asrkit train-ngram --order "$lm_order" "${text_opts[@]}" exp/lm/word${lm_order}gram.arpa.gz
  else
    log 5 "training the neural LM $lm_config on ${lm_text:-data/train/text} (dev: $dev_text)"
    asrkit train-lm --config "$lm_config" "${text_opts[@]}" --dev-text "$dev_text" \
      --tokenizer data/lang/tokenizer.json --out exp/lm/neural
  fi
fi

lm_opts=()
case "$lm" in
  ngram) lm_opts=(--lm exp/lm/word${lm_order}gram.arpa.gz --set lm_units=word) ;;
  neural) lm_opts=(--lm exp/lm/neural) ;;
esac

if run_stage 6; then
  tuned="$exp/tune_${valid_set//-/_}/decode.yaml"
  if [ "$lm" != none ]; then
    log 6 "choosing the LM weight ($lm_weights) and length bonus ($length_bonuses) on $valid_set"
    # shellcheck disable=SC2086
    asrkit tune-fusion --model "$exp" --data "$(dir_of "$valid_set")" --out "$(dirname "$tuned")" \
      --decode-config "$decode_config" "${lm_opts[@]}" --lm-weights $lm_weights --length-bonuses $length_bonuses
  else
    tuned="$decode_config"
  fi
  for part in $eval_sets; do
    log 6 "decoding $part with $tuned"
    asrkit decode --model "$exp" --data "$(dir_of "$part")" --out "$exp/decode_${part//-/_}" --decode-config "$tuned"
  done
fi

if run_stage 7; then
  for part in $eval_sets; do
    d="$exp/decode_${part//-/_}"
    log 7 "scoring $part"
    asrkit score --ref "$(dir_of "$part")/text" --hyp "$d/text" --utt2spk "$(dir_of "$part")/utt2spk" \
      --out "$d/scoring" | head -n 1
  done
fi
