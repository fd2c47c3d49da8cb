#!/usr/bin/env bash
# LibriSpeech recipe: Kaldi data dirs -> BPE tokenizer + CMVN -> Transformer (joint CTC/attention) -> average
# -> language models -> decode -> score.
#
# Usage: recipes/librispeech/run.sh --corpus-dir /path/to/LibriSpeech [--stage N] [--stop-stage N]
#            [--config conf/transformer.yaml] [--exp exp/transformer] [--train-sets "train-clean-100 ..."]
#            [--decode-settings "greedy ctc_prefix_lm joint_lm rescore"] [--lm-text FILE|librispeech]
#            [--lm none|ngram|neural|official] [--download true] [--hours 100|460|960] [--mirror URL]
#            [--bpe-size 5000] [--train-opts "--set train.epochs=50 ..."] [--nj 8]
#            [--ngpu N | --nproc N] [--nnodes M --rdzv-endpoint HOST:PORT [--rdzv-id ID]] [--workdir DIR]
#            [--augment true [--augment-dir DIR] [--reverb-prob 0.5] [--noise-prob 0.5]
#             [--rir-sets "simulated_rirs/smallroom ..."] [--noise-sets "noise music"]]
#   --workdir DIR: where data/ and exp/ go (default: this folder); --corpus-dir, --config, --lm-config and
#     --lm-text given as relative paths are read from this folder.
#   --ngpu N (alias --nproc N): stage 3 trains with N processes under `torchrun --standalone --nproc_per_node N`
#     (DDP: one process per GPU, or CPU processes with gloo). Multi-node: run the same command (--stage 3
#     --stop-stage 3) on each of M nodes with --nnodes M --rdzv-endpoint HOST:PORT (HOST: the first node;
#     torchrun --rdzv-backend c10d), exp/ on a shared filesystem; or once under Slurm with train_cmd=srun (cmd.sh).
#   --nj N: parallel jobs of stage 1 (audio headers) and of `asrkit decode --nj N` in stage 6 (same text as 1 job).
#   --decode-settings: stage 6 decodes every eval set with each conf/decode_<setting>.yaml; a setting ending in
#     _lm (conf/decode_<setting>.yaml, else conf/decode_<setting minus _lm>.yaml) fuses the stage 5 LM at the
#     weights tune-fusion picks on --valid-set (skipped with --lm none). Outputs: exp/<model>/decode_<setting>/<set>/.
#     A CTC-only model has no attention decoder: leave joint*, attention* and rescore* out for it.
#   Every stage is idempotent (a finished step is skipped; its inputs are fingerprinted in <dir>/.done/) and a
#   killed stage resumes when rerun (training from its latest checkpoint, decoding from its finished shards).
#   stage 0 (only with --download true): the --train-sets (default from --hours 100|460|960: train-clean-100,
#            + train-clean-360, + train-other-500) and --eval-sets parts (OpenSLR 12) into --corpus-dir, and the
#            --lm-resources (OpenSLR 11: 800M-word LM text, 3-/4-gram ARPA, lexicon, vocabulary) into --lm-dir
#            (default <corpus-dir>/lm); resumable, each file checked against local/checksums.txt before it is
#            unpacked (tools/download.py), complete parts skipped; --mirror URL for another OpenSLR mirror.
#            With --augment true also MUSAN (OpenSLR 17) and RIRS_NOISES (OpenSLR 28) into --augment-dir (default
#            <corpus-dir>/augment), checked against local/checksums.txt the same way.
#   --augment true: multi-condition training with real noises and impulse responses. Stage 0 (with or without
#            --download true) writes data/augment/: rir_list, the --rir-sets' impulse responses (folders of
#            RIRS_NOISES holding a rir_list; default the simulated small, medium and large rooms), and train_opts, the
#            --noise-sets folders of MUSAN (default noise and music) (local/prepare_augment.py); stage 3 trains with
#            augment.reverb.rir_list and augment.noise.dirs from them at --reverb-prob and --noise-prob, the noise
#            sources MUSAN's folders plus babble of other training utterances.
#   stage 1: data dirs + utt2dur + validation
#   stage 2: BPE tokenizer + global CMVN ; stage 3: train ; stage 4: average the best checkpoints
#   stage 5: language model on --lm-text (default: the training transcripts; --lm-text librispeech: the 800M-word
#            LM text): --lm ngram, a word --lm-order-gram through KenLM (asrkit train-ngram); --lm neural, the
#            --lm-config LM on BPE units (asrkit train-lm; --lm-max-lines N samples the text); --lm official,
#            the downloaded --official-lm ARPA (default 4-gram.arpa.gz) used as it is; --lm none
#   stage 6: for each of --decode-settings: (with an LM) LM weight/length bonus chosen on --valid-set, then
#            decode the eval sets ; stage 7: score each decode dir, write exp/<model>/RESULTS.md (tools/make_results.py)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"
. ./path.sh

stage=1
stop_stage=100
corpus_dir=
download=false
hours=100           # 100 | 460 | 960: the training parts used when --train-sets is not given
train_sets=         # default from --hours: train-clean-100 [+ train-clean-360 [+ train-other-500]]
eval_sets="dev-clean dev-other test-clean test-other"
valid_set=dev-clean
config="$root/conf/transformer.yaml"
exp=exp/transformer
bpe_size=5000
average_best=10
lm=ngram            # none | ngram (word 4-gram, fused at word boundaries) | neural (conf/lm_transformer.yaml)
                    # | official (the downloaded --official-lm ARPA as it is, word units)
lm_text=            # plain text, one sentence per line; empty: the training transcripts;
                    # librispeech: the 800M-word normalized LM text of OpenSLR 11 (stage 0 fetches it)
lm_max_lines=       # neural LM on a --lm-text: train on this many randomly chosen lines (empty: all)
lm_dir=             # the OpenSLR 11 LM resources (default: <corpus-dir>/lm)
lm_resources="librispeech-lm-norm.txt.gz 3-gram.arpa.gz 4-gram.arpa.gz librispeech-lexicon.txt librispeech-vocab.txt"
official_lm=4-gram.arpa.gz   # --lm official: a file of $lm_dir (e.g. 4-gram.pruned.1e-7.arpa.gz, see README)
mirror=             # OpenSLR mirror for stage 0 (default https://www.openslr.org/resources or $OPENSLR_MIRROR)
lm_order=4
lm_config="$root/conf/lm_transformer.yaml"
lm_weights="0.2 0.4 0.6"   # grid searched on --valid-set in stage 6 (asrkit tune-fusion)
length_bonuses="0 1"
nj=8
workdir="$here"     # data/ and exp/ go here
train_opts=""       # extra 'asrkit train' options, e.g. "--set train.epochs=1 --set data.num_workers=0"
decode_settings="greedy ctc_prefix_lm joint_lm rescore"   # conf/decode_<setting>.yaml each (see the usage)
ngpu=1              # training processes on this node (torchrun --nproc_per_node); --nproc is the same option
nproc=
nnodes=1            # > 1: multi-node torchrun with --rdzv-endpoint (run on every node)
rdzv_endpoint=      # HOST:PORT of the first node, e.g. node01:29500
rdzv_id=asrkit      # the same on every node of one job
augment=false       # true: MUSAN noise and RIRS_NOISES reverberation in training (stage 0 fetches/lists, stage 3 uses)
augment_dir=        # where musan/ and RIRS_NOISES/ are or go (default: <corpus-dir>/augment)
rir_sets="simulated_rirs/smallroom simulated_rirs/mediumroom simulated_rirs/largeroom"  # RIRS_NOISES/<set>/rir_list
noise_sets="noise music"   # musan/<set>: one noise source each
reverb_prob=0.5     # augment.reverb.prob with --augment true
noise_prob=0.5      # augment.noise.prob with --augment true
. "$root/tools/parse_options.sh"

[ -n "$corpus_dir" ] || { echo "$0: --corpus-dir is required (the folder holding LibriSpeech/)" >&2; exit 1; }
[ -z "$nproc" ] || ngpu="$nproc"
if [ "$nnodes" -gt 1 ] && [ -z "$rdzv_endpoint" ]; then
  echo "$0: --nnodes $nnodes needs --rdzv-endpoint HOST:PORT (the first node)" >&2; exit 1
fi
corpus_dir="$(realpath -m "$corpus_dir")"
lm_dir="$(realpath -m "${lm_dir:-$corpus_dir/lm}")"
augment_dir="$(realpath -m "${augment_dir:-$corpus_dir/augment}")"
case "$augment" in
  true|false) ;;
  *) echo "$0: --augment must be true or false, got '$augment'" >&2; exit 1 ;;
esac
if [ -z "$train_sets" ]; then
  case "$hours" in
    100) train_sets="train-clean-100" ;;
    460) train_sets="train-clean-100 train-clean-360" ;;
    960) train_sets="train-clean-100 train-clean-360 train-other-500" ;;
    *) echo "$0: --hours must be 100, 460 or 960 (or give --train-sets), got '$hours'" >&2; exit 1 ;;
  esac
fi
# paths given relative to this folder stay valid in --workdir
config="$(realpath -m "$config")"
lm_config="$(realpath -m "$lm_config")"
[ -z "$lm_text" ] || lm_text="$(realpath -m "$lm_text")"
mkdir -p "$workdir"
cd "$workdir"
log() { echo "$(date '+%Y-%m-%d %H:%M:%S') [stage $1] ${*:2}"; }
run_stage() { [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; }
dir_of() { echo "data/${1//-/_}"; }

# Idempotent steps: DIR/.done/NAME holds the fingerprint of what shaped a finished step's outputs (options and
# input files); the step is skipped while the fingerprint is unchanged, and rerun when an input changed.
fingerprint() { python "$root/tools/fingerprint.py" "$@"; }  # see that script for what counts
is_done() { [ -f "$1/.done/$2" ] && [ "$(cat "$1/.done/$2")" = "$3" ]; }
mark_done() { mkdir -p "$1/.done" && echo "$3" > "$1/.done/$2.tmp" && mv "$1/.done/$2.tmp" "$1/.done/$2"; }

if run_stage 0 && [ "$download" = true ]; then
  # tools/download.py underneath: resumable, verified against local/checksums.txt before unpacking, and a
  # part whose .complete marker exists is skipped, so a rerun after a crash fetches only what is missing.
  dl_opts=()
  [ -z "$mirror" ] || dl_opts=(--mirror "$mirror")
  for part in $train_sets $eval_sets; do
    log 0 "downloading $part (OpenSLR 12) into $corpus_dir"
    "$here/local/download_and_untar.sh" "${dl_opts[@]}" "$corpus_dir" "$part"
  done
  for f in $lm_resources; do
    log 0 "downloading the LM resource $f (OpenSLR 11) into $lm_dir"
    "$here/local/download_and_untar.sh" "${dl_opts[@]}" "$lm_dir" "$f"
  done
  if [ "$augment" = true ]; then
    log 0 "downloading musan (OpenSLR 17) into $augment_dir"
    "$here/local/download_and_untar.sh" "${dl_opts[@]}" "$augment_dir" musan
    log 0 "downloading rirs_noises (OpenSLR 28) into $augment_dir"
    "$here/local/download_and_untar.sh" "${dl_opts[@]}" "$augment_dir" rirs_noises
  fi
fi

if run_stage 0 && [ "$augment" = true ]; then
  key="$(fingerprint "$augment_dir/musan/.complete" "$augment_dir/RIRS_NOISES/.complete" "$rir_sets" "$noise_sets" \
         "$here/local/prepare_augment.py")"
  if is_done data/augment lists "$key"; then log 0 "data/augment is complete (data/augment/.done/lists); skipped"
  else
    log 0 "listing the impulse responses ($rir_sets) and noise folders (musan: $noise_sets) into data/augment"
    python "$here/local/prepare_augment.py" --rir-sets "${rir_sets// /,}" --noise-sets "${noise_sets// /,}" \
      "$augment_dir" data/augment
    mark_done data/augment lists "$key"
  fi
fi

if run_stage 1; then
  for part in $train_sets $eval_sets; do
    d="$(dir_of "$part")"
    key="$(fingerprint "$corpus_dir/LibriSpeech/$part" "$here/local/data_prep.py")"
    if is_done data "$part" "$key"; then log 1 "$d is complete (data/.done/$part); skipped"; continue; fi
    log 1 "preparing $d from $corpus_dir/LibriSpeech/$part"
    python "$here/local/data_prep.py" "$corpus_dir/LibriSpeech/$part" "$d"
    python "$root/tools/compute_utt2dur.py" --nj "$nj" "$d"
    python "$root/tools/validate_data_dir.py" "$d"
    mark_done data "$part" "$key"
  done
  dirs=()
  for part in $train_sets; do dirs+=("$(dir_of "$part")"); done
  key="$(fingerprint "${dirs[@]}")"
  if is_done data train "$key"; then log 1 "data/train is complete; skipped"
  else
    log 1 "combining ${dirs[*]} into data/train"
    python "$root/tools/combine_data.py" data/train "${dirs[@]}"
    mark_done data train "$key"
  fi
fi

if run_stage 2; then
  mkdir -p data/lang
  key="$(fingerprint data/train/text "$bpe_size")"
  if is_done data/lang tokenizer "$key"; then log 2 "data/lang/tokenizer.json is complete; skipped"
  else
    log 2 "training a $bpe_size-piece BPE tokenizer"
    asrkit train-tokenizer --text data/train/text --model-type bpe --vocab-size "$bpe_size" data/lang/tokenizer.json
    mark_done data/lang tokenizer "$key"
  fi
  key="$(fingerprint data/train "$config")"
  if is_done data/lang cmvn "$key"; then log 2 "data/lang/cmvn.json is complete; skipped"
  else
    log 2 "computing global CMVN stats on 20000 training utterances"
    asrkit compute-cmvn --config "$config" --max-utts 20000 --no-progress data/train data/lang/cmvn.json
    mark_done data/lang cmvn "$key"
  fi
fi

if run_stage 3; then
  # The launcher: asrkit itself, or torchrun with one process per GPU (several nodes: c10d rendezvous). $train_cmd
  # (cmd.sh) goes in front, e.g. srun, which then starts one torchrun per node.
  launcher=(asrkit)
  if [ "$nnodes" -gt 1 ]; then
    launcher=(torchrun --nnodes "$nnodes" --nproc_per_node "$ngpu" --rdzv-backend c10d
              --rdzv-endpoint "$rdzv_endpoint" --rdzv-id "$rdzv_id" -m asrkit)
  elif [ "$ngpu" -gt 1 ]; then
    launcher=(torchrun --standalone --nproc_per_node "$ngpu" -m asrkit)
  fi
  aug_opts=()
  if [ "$augment" = true ]; then
    [ -f data/augment/train_opts ] || {
      echo "$0: data/augment/train_opts: no augmentation lists: run stage 0 with --augment true" >&2; exit 1; }
    while read -r kv; do [ -z "$kv" ] || aug_opts+=(--set "$kv"); done < data/augment/train_opts
    aug_opts+=(--set "augment.reverb.prob=$reverb_prob" --set "augment.noise.prob=$noise_prob"
               --set "augment.noise.generated=[babble]")
  fi
  key="$(fingerprint "$config" "$train_opts" data/lang/tokenizer.json data/lang/cmvn.json data/train \
         "$(dir_of "$valid_set")" ${aug_opts[@]:+"${aug_opts[@]}" data/augment/rir_list})"
  if is_done "$exp" train "$key"; then log 3 "$exp is trained ($exp/.done/train); skipped"
  else
    log 3 "training $config into $exp with ${launcher[*]} (resumes if interrupted)"
    # shellcheck disable=SC2086
    $train_cmd "${launcher[@]}" train --config "$config" --train-data data/train --valid-data "$(dir_of "$valid_set")" \
      --out "$exp" --tokenizer data/lang/tokenizer.json --cmvn data/lang/cmvn.json "${aug_opts[@]}" $train_opts
    mark_done "$exp" train "$key"
  fi
fi

if run_stage 4; then
  key="$(fingerprint "$exp/checkpoints.json" "$average_best")"
  if is_done "$exp" average "$key"; then log 4 "$exp/model.pt is averaged; skipped"
  else
    log 4 "averaging the $average_best best checkpoints"
    asrkit average --model "$exp" --best "$average_best"
    mark_done "$exp" average "$key"
  fi
fi

if run_stage 5 && [ "$lm" != none ]; then
  mkdir -p exp/lm
  text_opts=(--text data/train/text)
  dev_text="$(dir_of "$valid_set")/text"
  src="$lm_text"
  if [ "$lm_text" = librispeech ] && [ "$lm" != official ]; then
    # the 800M-word normalized text (40M lines, 4.4 GB unpacked); the asrkit LM trainers read plain text
    src="$lm_dir/librispeech-lm-norm.txt"
    [ -f "$lm_dir/librispeech-lm-norm.txt.gz.complete" ] || {
      echo "$0: $lm_dir/librispeech-lm-norm.txt.gz is not downloaded: run stage 0 with --download true" >&2; exit 1; }
    if [ ! -f "$src" ]; then
      log 5 "unpacking $src.gz"
      gunzip -c "$src.gz" > "$src.tmp" && mv "$src.tmp" "$src"
    fi
  fi
  if [ -n "$src" ] && [ "$lm" != official ]; then  # plain text: the dev transcripts lose their utterance ids to match
    if [ "$lm" = neural ] && [ -n "$lm_max_lines" ]; then
      sample="exp/lm/text_${lm_max_lines}lines.txt"
      if [ ! -f "$sample" ]; then  # a fixed random source: the same lines on every rerun
        log 5 "sampling $lm_max_lines lines of $src into $sample"
        shuf -n "$lm_max_lines" --random-source=<(yes) "$src" > "$sample.tmp" && mv "$sample.tmp" "$sample"
      fi
      src="$sample"
    fi
    text_opts=(--text "$src" --plain-text)
    cut -d' ' -f2- "$dev_text" > exp/lm/dev.txt
    dev_text=exp/lm/dev.txt
  fi
  case "$lm" in
    official)
      [ -f "$lm_dir/$official_lm" ] || {
        echo "$0: --lm official: no $lm_dir/$official_lm (stage 0 with --download true and it in --lm-resources)" >&2
        exit 1; }
      # Nothing to train: OpenSLR 11's ARPA files are upper-case words, like LibriSpeech's transcripts and
      # so the tokenizer's text; stage 6 fuses it at word boundaries (lm_units=word).
      log 5 "using $lm_dir/$official_lm as it is (word units)" ;;
    ngram)
      key="$(fingerprint "${text_opts[@]}" "$lm_order")"
      if is_done exp/lm "word${lm_order}gram" "$key"; then log 5 "exp/lm/word${lm_order}gram.arpa.gz is complete; skipped"
      else
        log 5 "training a word $lm_order-gram on ${src:-data/train/text} (KenLM lmplz; tools/install/install_kenlm.sh builds it)"
        asrkit train-ngram --order "$lm_order" "${text_opts[@]}" "exp/lm/word${lm_order}gram.arpa.gz"
        mark_done exp/lm "word${lm_order}gram" "$key"
      fi ;;
    neural)
      key="$(fingerprint "${text_opts[@]}" "$dev_text" "$lm_config" data/lang/tokenizer.json)"
      if is_done exp/lm neural "$key"; then log 5 "exp/lm/neural is trained; skipped"
      else  # train-lm resumes from its latest checkpoint when a run was killed
        log 5 "training the neural LM $lm_config on ${src:-data/train/text} (dev: $dev_text)"
        asrkit train-lm --config "$lm_config" "${text_opts[@]}" --dev-text "$dev_text" \
          --tokenizer data/lang/tokenizer.json --out exp/lm/neural
        mark_done exp/lm neural "$key"
      fi ;;
    *) echo "$0: --lm must be none, ngram, neural or official, got '$lm'" >&2; exit 1 ;;
  esac
fi

lm_opts=()
case "$lm" in
  ngram) lm_opts=(--lm exp/lm/word${lm_order}gram.arpa.gz --set lm_units=word) ;;
  neural) lm_opts=(--lm exp/lm/neural) ;;
  official) lm_opts=(--lm "$lm_dir/$official_lm" --set lm_units=word) ;;
esac

decode_conf_of() {  # a decode setting -> conf/decode_<setting>.yaml (an _lm setting may use the YAML without _lm)
  local f
  for f in "$root/conf/decode_$1.yaml" "$root/conf/decode_${1%_lm}.yaml"; do
    [ -f "$f" ] && { echo "$f"; return 0; }
  done
  echo "$0: decode setting '$1': no $root/conf/decode_$1.yaml" >&2
  return 1
}

if run_stage 6; then
  for setting in $decode_settings; do decode_conf_of "$setting" > /dev/null; done  # every name checked first
  for setting in $decode_settings; do
    conf="$(decode_conf_of "$setting")"
    used="$conf"
    fusion=()
    if [ "${setting%_lm}" != "$setting" ]; then
      if [ "$lm" = none ]; then log 6 "$setting: skipped (--lm none)"; continue; fi
      fusion=("${lm_opts[@]}")
      tune_dir="$exp/tune_${setting}_${valid_set//-/_}"
      used="$tune_dir/decode.yaml"
      key="$(fingerprint "$conf" "${fusion[@]}" "$exp/model.pt" "$(dir_of "$valid_set")" "$lm_weights" "$length_bonuses")"
      if is_done "$exp" "tune_$setting" "$key"; then log 6 "$setting: $used is complete; skipped"
      else
        log 6 "$setting: choosing the LM weight ($lm_weights) and length bonus ($length_bonuses) on $valid_set"
        # shellcheck disable=SC2086
        asrkit tune-fusion --model "$exp" --data "$(dir_of "$valid_set")" --out "$tune_dir" \
          --decode-config "$conf" "${fusion[@]}" --lm-weights $lm_weights --length-bonuses $length_bonuses
        mark_done "$exp" "tune_$setting" "$key"
      fi
    fi
    for part in $eval_sets; do
      out="$exp/decode_$setting/$part"
      key="$(fingerprint "$used" "${fusion[@]}" "$exp/model.pt" "$(dir_of "$part")")"
      if is_done "$exp" "decode_${setting}_$part" "$key"; then log 6 "$out is complete; skipped"; continue; fi
      log 6 "decoding $part with $used in $nj jobs into $out"
      asrkit decode --model "$exp" --data "$(dir_of "$part")" --out "$out" --decode-config "$used" --nj "$nj"
      mark_done "$exp" "decode_${setting}_$part" "$key"
    done
  done
fi

if run_stage 7; then
  for setting in $decode_settings; do
    for part in $eval_sets; do
      d="$exp/decode_$setting/$part"
      [ -f "$d/text" ] || continue  # an _lm setting under --lm none
      key="$(fingerprint "$(dir_of "$part")/text" "$(dir_of "$part")/utt2spk" "$d/text")"
      if ! is_done "$exp" "score_${setting}_$part" "$key"; then
        asrkit score --ref "$(dir_of "$part")/text" --hyp "$d/text" --utt2spk "$(dir_of "$part")/utt2spk" \
          --out "$d/scoring" > /dev/null
        mark_done "$exp" "score_${setting}_$part" "$key"
      fi
      log 7 "$setting $part: $(head -n 1 "$d/scoring/result.txt")"
    done
  done
  log 7 "writing $exp/RESULTS.md"
  python "$root/tools/make_results.py" --config "$config" --train-opts "$train_opts" --settings "$decode_settings" "$exp"
fi
