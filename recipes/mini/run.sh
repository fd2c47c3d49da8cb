#!/usr/bin/env bash
# Mini recipe: synthesize English speech with several synthesizers (every English voice of espeak-ng, festival and
# flite for training, but flite's awb and rms: held out as an unseen-voice test set), train a CTC Conformer,
# train a word n-gram LM on book text, decode (greedy, and CTC prefix beam search with the LM fused, constrained
# to the LM's words) and score.
# This is what `make demo` runs (--size small, 11-15 minutes on a 2-core CPU from a fresh clone); --size medium
# is the larger recipe (more speech, a 12-layer encoder; 45 minutes on a 2-core CPU); --size small-joint is the demo
# with an attention decoder, also decoded by joint CTC/attention search; --size small-streaming is the demo trained to
# stream as well (dynamic chunk training, causal convolution: conf/mini_streaming.yaml). Figures: docs/results.md.
# Nothing is downloaded.
#
# Usage: recipes/mini/run.sh [--size small|medium|small-joint|small-streaming] [--stage N] [--stop-stage N] [--workdir DIR]
#                            [--config conf/X.yaml] [--exp exp/NAME] [--train-opts "--set key=value ..."]
#                            [--nproc N] [--average K] [--lm-kind ngram|neural] [--lm-order 3]
#                            [--lm-corpus FILE] [--lm-config conf/lm_lstm_small.yaml] [--lm-opts "--set key=value ..."]
#                            [--decode-config conf/decode_ctc_prefix_wordlm.yaml] [--num-train N]
#                            [--units char|bpe] [--vocab-size N] [--decode-beam N] [--joint-search true|false]
#                            [--joint-lm-weights "0.3 0.6 1.0"] [--joint-decode-config conf/decode_joint_wordlm.yaml]
#                            [--streaming-chunks "640 320"]
#                            [--jobs 2] [--test-reverb-noise true|false] [--reverb-noise-snr 5,20]
#                            [--derived-voices true|false] [--extra-train SPK:N,...]
#   --size      small: 4800 training utterances (~5.5 h of speech), conf/mini_small.yaml (4-layer Conformer);
#               medium: 6000 utterances, conf/mini_medium.yaml (12-layer Conformer); small-joint: the small data
#               and conf/mini_small_joint.yaml (the small model + a 2-layer attention decoder, joint CTC/attention
#               loss) with --joint-search true; small-streaming: the small data and conf/mini_streaming.yaml (the
#               small model with dynamic chunk training and a causal convolution, so it also decodes live in
#               chunks: asrkit decode/transcribe --streaming), into exp/small_streaming. Options after it still
#               override its settings (--num-train, --config, --nproc, ...).
#   --nproc N   train with N processes (torchrun --standalone, gloo on CPU): on 2 cores, 2 processes of one
#               thread each train about 1.45x faster than one (docs/levers.md)
#   --jobs N    parallel processes of stage 0's synthesis and of stage 6's joint CTC/attention decodes (default 2)
#   --average K decode with the average of the best K epochs by validation loss (0: the last epoch)
#   --units     char (default): one token per letter, data/lang/tokenizer.json; bpe: a sentencepiece BPE model of
#               --vocab-size pieces (default 256) in data/lang_bpe<N>/tokenizer.json (use it with a x6/x8
#               subsampling config: fewer tokens per second allow fewer frames)
#   --decode-beam N  the beam of stage 6's LM search (default: 1000 with the n-gram, 0 with the neural LM; 0: the
#               decoding config's own), wider than stage 5's (the config's 100), which decodes dev once per grid
#               point: on the demo's model beam 100 -> 400 -> 1000 took test from 20.4 to 18.5 and 18.0% WER, and
#               dev chose the same weights at 1000 as at 100 (docs/levers.md)
#   --vtln "0.85 0.9 0.95 1 1.05 1.1 1.15" (default): stage 6's greedy and LM decodes warp each test speaker's
#               filterbank by the factor of this list under which the model is most confident on the speaker's
#               utterances (decode.vtln, asrkit.pipeline.vtln; exp/decode_<set>*/spk2warp): over two seeds of the demo,
#               test_unseen 42.33 -> 39.67 / 39.25% with the LM and test no worse (docs/results.md); "": off
#   --joint-search true: stages 5-7 also tune (the LM weight, on dev) and decode joint CTC/attention search,
#               without an LM (conf/decode_joint.yaml) and with it (--joint-decode-config, default
#               conf/decode_joint_wordlm.yaml; conf/decode_joint.yaml with --lm-kind neural): rows decode_<set>_joint
#               and decode_<set>_joint_lm. Needs a model with an attention decoder (--size small-joint).
#   --streaming-chunks "640 320": stage 6 also decodes each test set as live streams (asrkit decode --streaming) with
#               these chunk sizes in ms, greedy and with the LM: rows decode_<set>_stream<ms>[_lm]. --size
#               small-streaming sets "640 320"; a model without dynamic chunk training streams badly.
#   --test-reverb-noise true (default): stage 0 also makes data/test_reverb_noise, the test utterances through
#               simulated rooms and noises that training never draws (tools/make_reverb_noise_set.py: the held-out
#               room and noise sets are stated there) at SNRs drawn from --reverb-noise-snr (dB); stages 6-7 decode
#               and score it beside test and test_unseen
#   --derived-voices true: stage 0 also trains on derived speakers (tools/make_synthetic_corpus.py
#               --derived-voices): flite's and festival's slt as men (F0 and formants lowered, by the F0 setting
#               and resampling) and festival's kal and ked as women, each its own speaker id; test_unseen stays
#               flite's awb and rms. Default false: over three seeds of the demo it read test_unseen 1.3 points
#               and the rooms 2.4 points better with the LM but the same test audio 2.4 points worse
#               (docs/results.md, derived voices)
#   --extra-train SPK:N,...: stage 0 adds N training utterances of each named speaker (a training or derived
#               speaker id; tools/make_synthetic_corpus.py --extra-train) after the drawn ones, which stay the same
#               audio, as do dev and every test set. Default flite_slt_m:800: flite's slt as a man, the training
#               voice nearest the held-out awb and rms; over three seeds of the demo, with the LM, 400 of them read
#               test_unseen 3.7 points better and test a tie, 800 test_unseen 5.6 and test 1.5 points better than
#               none (docs/results.md, extra training voices). "" for none
#   --lm-kind   ngram: word n-gram (KenLM lmplz, tools/install/install_kenlm.sh) and a lexicon of its words;
#               neural: the character LSTM LM of --lm-config on the same text
#   stage 0: synthesize data/{train,dev,test,test_unseen}   stage 4: LM text (book text + train transcripts) and LM
#            (+ data/test_reverb_noise from data/test)      stage 5: LM weight and length bonus chosen on data/dev
#   stage 1: validate the data dirs                         stage 6: decode test, test_unseen, test_reverb_noise:
#   stage 2: tokenizer + global CMVN stats                           greedy, with LM
#   stage 3: train (+ checkpoint averaging)                 stage 7: score; one table
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

size=small
joint_search=false
streaming_chunks=""
for ((i = 1; i < $#; i++)); do  # the preset must be known before the other options override its settings
  if [ "${!i}" = --size ]; then j=$((i + 1)); size="${!j}"; fi
done
for arg in "$@"; do case "$arg" in --size=*) size="${arg#--size=}" ;; esac; done
case "$size" in
  small)
    num_train=4800; nproc=2; config="$root/conf/mini_small.yaml"; exp=exp/small ;;
  medium)
    num_train=6000; nproc=2; config="$root/conf/mini_medium.yaml"; exp=exp/medium ;;
  small-joint)
    num_train=4800; nproc=2; config="$root/conf/mini_small_joint.yaml"; exp=exp/small_joint; joint_search=true ;;
  small-streaming)
    num_train=4800; nproc=2; config="$root/conf/mini_streaming.yaml"; exp=exp/small_streaming
    streaming_chunks="640 320" ;;
  *) echo "$0: --size must be small, medium, small-joint or small-streaming, not '$size'" >&2; exit 1 ;;
esac
stage=0
stop_stage=100
workdir="$here"
num_dev=100
num_test=100
num_test_unseen=100   # data/test_unseen: flite voices no training split has (0: none)
test_reverb_noise=true   # data/test_reverb_noise: data/test through held-out rooms and noises
reverb_noise_snr=5,20    # its SNR range in dB
derived_voices=false     # stage 0: also the derived speakers (slt as a man, kal and ked as women)
extra_train=flite_slt_m:800   # stage 0: SPK:N,... more train utterances of those speakers ("": none)
snr_db=25
seed=1
jobs=2
average=0
units=char
vocab_size=256
train_opts=""
lm_kind=ngram
lm_corpus="$root/tools/corpus/lm_text.txt.gz"   # book text for the LM (one sentence a line, .gz or plain)
lm_order=3            # a word 3-gram: 4- and 5-grams were no better on dev (docs/levers.md), and load slower
lm_dir=""            # default: exp/lm_<lm-kind>
lm_config="$root/conf/lm_lstm_small.yaml"
lm_opts=""
decode_config=""
lm_weights="0.4 0.6 0.8 1.0"   # the grid searched on data/dev in stage 5
decode_beam=""
vtln="0.85 0.9 0.95 1 1.05 1.1 1.15"   # stage 6: decode-time VTLN's candidate warp factors ("": off)
length_bonuses="0 1 2"
joint_lm_weights="0.3 0.6 1.0"   # stage 5's grid for the joint search (label-synchronous: ~1 min per dev decode)
joint_length_bonuses="0"
joint_decode_config=""
. "$root/tools/parse_options.sh"
mkdir -p "$workdir"
cd "$workdir"
case "$units" in
  char) lang=data/lang ;;
  bpe) lang="data/lang_bpe$vocab_size" ;;
  *) echo "$0: --units must be char or bpe, not '$units'" >&2; exit 1 ;;
esac
lm_dir="${lm_dir:-exp/lm_$lm_kind}"
case "$lm_kind" in
  ngram) decode_config="${decode_config:-$root/conf/decode_ctc_prefix_wordlm.yaml}"; decode_beam="${decode_beam:-1000}"
         joint_decode_config="${joint_decode_config:-$root/conf/decode_joint_wordlm.yaml}"
         lm="$lm_dir/word${lm_order}.arpa"; lexicon_opts=(--set "lexicon=$PWD/data/lm/words.txt") ;;
  neural) decode_config="${decode_config:-$root/conf/decode_ctc_prefix_lm.yaml}"; decode_beam="${decode_beam:-0}"
          joint_decode_config="${joint_decode_config:-$root/conf/decode_joint.yaml}"; lm="$lm_dir"; lexicon_opts=() ;;
  *) echo "$0: --lm-kind must be ngram or neural, not '$lm_kind'" >&2; exit 1 ;;
esac
case "$joint_search" in
  true|false) ;;
  *) echo "$0: --joint-search must be true or false, not '$joint_search'" >&2; exit 1 ;;
esac
case "$test_reverb_noise" in
  true|false) ;;
  *) echo "$0: --test-reverb-noise must be true or false, not '$test_reverb_noise'" >&2; exit 1 ;;
esac
case "$derived_voices" in
  true|false) ;;
  *) echo "$0: --derived-voices must be true or false, not '$derived_voices'" >&2; exit 1 ;;
esac

# One BLAS thread per process: with the data-loader worker on the other core this is the fastest setting
# on 2 cores, and it does not collapse when something else is running (2 threads then run 4x slower).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

log() { echo "$(date '+%Y-%m-%d %H:%M:%S') [stage $1] ${*:2}"; }
run_stage() { [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; }
test_sets=(test)
[ "$num_test_unseen" -gt 0 ] && test_sets+=(test_unseen)
[ "$test_reverb_noise" = true ] && test_sets+=(test_reverb_noise)
if [ "$test_reverb_noise" = true ] && ! run_stage 0 && [ ! -f data/test_reverb_noise/wav.scp ] \
    && { run_stage 1 || run_stage 4 || run_stage 6 || run_stage 7; }; then
  echo "$0: data/test_reverb_noise is missing (a work dir made before it existed?): make it with python" \
    "$root/tools/make_reverb_noise_set.py --src data/test --out data/test_reverb_noise --seed $seed, or pass" \
    "--test-reverb-noise false" >&2
  exit 1
fi
decode_suffixes=("" _lm)   # stage 6's outputs per test set: $exp/decode_<set><suffix>
[ "$joint_search" = true ] && decode_suffixes+=(_joint _joint_lm)
for ms in $streaming_chunks; do decode_suffixes+=("_stream$ms" "_stream${ms}_lm"); done

if run_stage 0; then
  log 0 "synthesizing speech into data/ (train $num_train, dev $num_dev, test $num_test," \
    "test_unseen $num_test_unseen utterances; derived voices: $derived_voices; extra train: ${extra_train:-none})"
  python "$root/tools/make_synthetic_corpus.py" --out data --num-train "$num_train" --num-dev "$num_dev" \
    --num-test "$num_test" --num-test-unseen "$num_test_unseen" --seed "$seed" --snr-db "$snr_db" --jobs "$jobs" \
    --derived-voices "$derived_voices" --extra-train "$extra_train"
  if [ "$test_reverb_noise" = true ]; then
    log 0 "data/test through held-out rooms and noises at $reverb_noise_snr dB SNR into data/test_reverb_noise"
    python "$root/tools/make_reverb_noise_set.py" --src data/test --out data/test_reverb_noise --seed "$seed" \
      --snr "$reverb_noise_snr"
  fi
fi

if run_stage 1; then
  for split in train dev "${test_sets[@]}"; do
    log 1 "validating data/$split"
    python "$root/tools/validate_data_dir.py" "data/$split"
  done
fi

if run_stage 2; then
  mkdir -p data/lang "$lang"
  if [ "$units" = char ]; then
    log 2 "training the character tokenizer"
    asrkit train-tokenizer --text data/train/text --model-type char "$lang/tokenizer.json"
  else
    log 2 "training a BPE tokenizer of $vocab_size pieces"
    asrkit train-tokenizer --text data/train/text --model-type bpe --vocab-size "$vocab_size" "$lang/tokenizer.json"
  fi
  log 2 "computing global CMVN stats"
  asrkit compute-cmvn --config "$config" --max-utts 500 --no-progress data/train data/lang/cmvn.json
fi

if run_stage 3; then
  launcher=(asrkit)
  [ "$nproc" -gt 1 ] && launcher=(torchrun --standalone --nproc_per_node "$nproc" -m asrkit)
  log 3 "training $config into $exp ($nproc process(es))"
  # shellcheck disable=SC2086
  "${launcher[@]}" train --config "$config" --train-data data/train --valid-data data/dev --out "$exp" \
    --tokenizer "$lang/tokenizer.json" --cmvn data/lang/cmvn.json $train_opts
  if [ "$average" -gt 0 ]; then
    log 3 "averaging the best $average epochs by validation loss into $exp/model.pt"
    asrkit average --model "$exp" --best "$average" --metric valid_loss
  fi
fi

if run_stage 4; then
  log 4 "LM text: $lm_corpus + data/train/text, no dev/test sentence"
  python "$root/tools/make_lm_text.py" --out data/lm/text.txt --corpus "$lm_corpus" --transcripts data/train/text \
    --exclude data/dev/text $(printf 'data/%s/text ' "${test_sets[@]}") --word-list data/lm/words.txt
  if [ "$lm_kind" = ngram ]; then
    log 4 "training a word $lm_order-gram into $lm"
    mkdir -p "$lm_dir"
    asrkit train-ngram --order "$lm_order" --plain-text --text data/lm/text.txt "$lm"
  else
    log 4 "training the LM $lm_config into $lm_dir (dev perplexity on data/dev)"
    python "$root/tools/make_lm_text.py" --out data/lm/dev.txt --corpus --transcripts data/dev/text
    # shellcheck disable=SC2086
    asrkit train-lm --config "$lm_config" --plain-text --text data/lm/text.txt --dev-text data/lm/dev.txt \
      --tokenizer "$lang/tokenizer.json" --out "$lm_dir" $lm_opts
  fi
fi

if run_stage 5; then
  log 5 "choosing the LM weight ($lm_weights) and length bonus ($length_bonuses) on data/dev"
  # shellcheck disable=SC2086
  asrkit tune-fusion --model "$exp" --data data/dev --out "$exp/tune_dev" --decode-config "$decode_config" \
    --lm "$lm" "${lexicon_opts[@]}" --lm-weights $lm_weights --length-bonuses $length_bonuses
  if [ "$joint_search" = true ]; then
    log 5 "choosing the joint CTC/attention search's LM weight ($joint_lm_weights) and length bonus" \
      "($joint_length_bonuses) on data/dev"
    # shellcheck disable=SC2086
    asrkit tune-fusion --model "$exp" --data data/dev --out "$exp/tune_dev_joint" \
      --decode-config "$joint_decode_config" --lm "$lm" "${lexicon_opts[@]}" --lm-weights $joint_lm_weights \
      --length-bonuses $joint_length_bonuses
  fi
fi

if run_stage 6; then
  for set in "${test_sets[@]}"; do
    vtln_opts=()
    [ -n "$vtln" ] && vtln_opts=(--set "vtln.alphas=[${vtln// /,}]")
    log 6 "decoding data/$set: greedy CTC ${vtln_opts[*]}"
    asrkit decode --model "$exp" --data "data/$set" --out "$exp/decode_$set" "${vtln_opts[@]}"
    beam_opts=()
    [ "$decode_beam" -gt 0 ] && beam_opts=(--set "beam=$decode_beam")
    log 6 "decoding data/$set with $exp/tune_dev/decode.yaml (the LM, weights chosen on dev) ${beam_opts[*]} ${vtln_opts[*]}"
    asrkit decode --model "$exp" --data "data/$set" --out "$exp/decode_${set}_lm" \
      --decode-config "$exp/tune_dev/decode.yaml" "${beam_opts[@]}" "${vtln_opts[@]}"
    if [ "$joint_search" = true ]; then
      log 6 "decoding data/$set: joint CTC/attention search without an LM ($root/conf/decode_joint.yaml)"
      asrkit decode --model "$exp" --data "data/$set" --out "$exp/decode_${set}_joint" --nj "$jobs" \
        --decode-config "$root/conf/decode_joint.yaml"
      log 6 "decoding data/$set: joint CTC/attention search with $exp/tune_dev_joint/decode.yaml (the LM)"
      asrkit decode --model "$exp" --data "data/$set" --out "$exp/decode_${set}_joint_lm" --nj "$jobs" \
        --decode-config "$exp/tune_dev_joint/decode.yaml"
    fi
    for ms in $streaming_chunks; do
      log 6 "decoding data/$set as live streams of $ms ms chunks: greedy CTC, and with the LM"
      asrkit decode --model "$exp" --data "data/$set" --out "$exp/decode_${set}_stream$ms" --streaming --chunk-ms "$ms"
      asrkit decode --model "$exp" --data "data/$set" --out "$exp/decode_${set}_stream${ms}_lm" \
        --decode-config "$exp/tune_dev/decode.yaml" "${beam_opts[@]}" --streaming --chunk-ms "$ms"
    done
  done
fi

if run_stage 7; then
  log 7 "scoring"
  for set in "${test_sets[@]}"; do
    for suffix in "${decode_suffixes[@]}"; do
      d="decode_${set}$suffix"
      asrkit score --ref "data/$set/text" --hyp "$exp/$d/text" --utt2spk "data/$set/utt2spk" \
        --out "$exp/$d/scoring" > "$exp/$d/scoring.log"
      echo "$d: $(head -n 1 "$exp/$d/scoring.log")"
    done
  done
  echo "alignments: $PWD/$exp/decode_test_lm/scoring/result.pra"
  head -n 30 "$exp/decode_test_lm/scoring/result.pra"
fi
