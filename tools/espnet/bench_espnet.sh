#!/usr/bin/env bash
# Side-by-side benchmark against ESPnet2 (issue 12): train both toolkits on the same Kaldi data dirs with the
# same model, features, SpecAugment, optimizer, schedule and epochs; decode CTC without an LM (both by best
# path, and ESPnet also by its own beam-1 prefix search); print one table of WER/CER (asrkit's scorer on the
# same references) and training throughput (audio seconds per second). tools/espnet/bench_espnet_audit.md: what
# differs between the two at tiny_ctc.yaml.
#
# Usage: tools/espnet/bench_espnet.sh --asrkit-config conf/tiny_ctc.yaml --data DIR (--epochs N | --budget-minutes M)
#                              --out DIR [--threads 1] [--stage 0] [--stop-stage 100]
#                              [--tokenizer DIR/lang/tokenizer.json] [--cmvn FILE | none]
#                              [--overrides "KEY=VALUE ..."] [--probe-epochs 2] [--cores "0 1"]
#                              [--lm-decode-config decode.yaml] [--lm-weights "W ..." [--length-bonuses "B ..."]]
#                              [--probe-from OTHER_OUT]
#   --overrides: asrkit config overrides (as asrkit train's --set; space-separated) applied to --asrkit-config
#   for both toolkits, e.g. "frontend.utterance_cmn=false data.max_frames=4000" for the demo's model
#   DIR holds train/ dev/ test/ Kaldi dirs (wav.scp of audio files, text, utt2dur) and lang/ (asrkit's char
#   tokenizer, as recipes/mini/run.sh stage 2 writes it). Without --cmvn, stage 0 computes the
#   stats for --asrkit-config into OUT/asrkit/cmvn.json (the recipe's lang/cmvn.json may have been computed with
#   another frontend, e.g. per-utterance normalisation, and asrkit train refuses stats of another frontend).
#   stage 0: ESPnet asr.yaml from the asrkit config, asrkit's --set overrides, ESPnet's token list
#   stage 1: ESPnet collect_stats (--normalize none): shapes and global_mvn stats; text_shape.char
#   stage 2: ESPnet training (timed)                   stage 3: asrkit training (timed), right after it
#   stage 4: ESPnet decoding of test/, twice: its asr_inference (beam 1, ctc_weight 1.0: a label-synchronous
#            CTC prefix search) into OUT/espnet/decode_test/, and best path (frame argmax, collapse, drop blank;
#            tools/espnet/espnet_bench.py greedy) into OUT/espnet/decode_test_greedy/
#   stage 5: asrkit greedy (best-path) CTC decoding of test/ into OUT/asrkit/decode_test/
#   --lm-decode-config FILE: both models decoded once more by asrkit's search as FILE says (a word LM, its lexicon,
#            weights): stage 4 dumps ESPnet's CTC log-probabilities (espnet_bench.py posteriors, into
#            OUT/espnet/posteriors_test/) and decodes them with tools/espnet/espnet_lm.py into
#            OUT/espnet/decode_test_lm/; stage 5 runs asrkit decode --decode-config FILE into OUT/asrkit/decode_test_lm/
#   --lm-weights "W ...", --length-bonuses "B ..." (with --lm-decode-config): each model's LM weight and length
#            bonus chosen on dev/ by the same grid before test is decoded: asrkit's by asrkit tune-fusion into
#            OUT/asrkit/tune_dev/, ESPnet's by espnet_lm.py --tune-ref on its dev posteriors into OUT/espnet/tune_dev/
#            (a model trained longer is more confident, so one weight for both favours one of them)
#   stage 6: per-step time of both on identical batches (tools/espnet/espnet_step_time.py, interleaved, 2 rounds)
#   stage 7: score all three decodings, print the table and write it to OUT/results.md
#            (tools/espnet/espnet_report.py); the asrkit / ESPnet WER ratio is taken against ESPnet's best path (the
#            same rule as asrkit's) and also printed against its prefix search
#   --budget-minutes M: equal training time instead of equal epochs. Both toolkits train at the same time on this
#   machine, asrkit pinned to the first CPU of --cores and ESPnet to the second (taskset; --threads 1), each for as
#   many epochs as its own measured speed fits in M minutes; stages 2 and 3 become:
#   stage 2: the probe: both train --probe-epochs epochs at once into OUT/probe/ (timed: asrkit_probe, espnet_probe)
#   stage 3: tools/espnet/espnet_budget.py plan: from each probe, its seconds per epoch (the spacing of its log's
#            epoch stamps) and start-up; its epochs = floor((M x 60 - start-up) / seconds per epoch), at least 2
#            (OUT/budget.json); both configs written for their epochs; both train at once (timed, as above)
#   A timed training of this mode that was killed starts again from scratch (its wall time is what is compared).
#   --probe-from OTHER_OUT: stage 2 reuses the probe of that equal-time run on this machine (another seed: the
#            seed does not change the throughput) instead of probing (espnet_budget.py reuse-probe); the plan says so
# Needs .venv (make install) and .venv-espnet (tools/espnet/setup_espnet_env.sh). Both toolkits run with
# OMP_NUM_THREADS=--threads and one data-loader worker (data.num_workers of the config, for both).
# Stages are idempotent: a timed training that finished is not run again (OUT/timings.json); decoding and
# scoring stages rewrite their outputs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

asrkit_config=""
data=""
epochs=""
out=""
threads=1
stage=0
stop_stage=100
tokenizer=""
cmvn=""
overrides=""
budget_minutes=""   # equal training time: both toolkits at once, one CPU each, each fitting its epochs in M minutes
probe_epochs=2      # epochs of the probe that measures each toolkit's seconds per epoch (>= 2: start-up apart)
cores="0 1"         # the CPUs of asrkit and ESPnet in the equal-time mode
lm_decode_config="" # a decode.yaml with an LM: both models decoded by asrkit's search with it (stages 4 and 5)
probe_from=""       # the OUT of an equal-time run whose probe this one reuses (stage 2)
lm_weights=""       # with lm_decode_config: the grid of LM weights each model's fusion is chosen from on dev
length_bonuses="0"  # and of length bonuses
. "$root/tools/parse_options.sh"
usage_error() { echo "$0: $*" >&2; exit 2; }
[ $# -eq 0 ] || usage_error "unexpected argument '$1' (see --help)"
for v in asrkit_config data out; do
  [ -n "${!v}" ] || usage_error "--${v//_/-} is required (see --help)"
done
cpus=()
if [ -n "$budget_minutes" ]; then
  [ -z "$epochs" ] || usage_error "--epochs and --budget-minutes exclude each other (the budget decides each" \
    "toolkit's epochs)"
  { [[ "$budget_minutes" =~ ^[0-9]+([.][0-9]+)?$ ]] && awk "BEGIN { exit !($budget_minutes > 0) }"; } \
    || usage_error "--budget-minutes must be a number of minutes > 0, not '$budget_minutes'"
  { [[ "$probe_epochs" =~ ^[0-9]+$ ]] && [ "$probe_epochs" -ge 1 ]; } \
    || usage_error "--probe-epochs must be an integer >= 1, not '$probe_epochs'"
  [ "$threads" = 1 ] || usage_error "--budget-minutes gives each toolkit one CPU: --threads must be 1, not '$threads'"
  read -r -a cpus <<< "$cores"
  if [ ${#cpus[@]} -ne 2 ] || ! [[ "${cpus[0]}.${cpus[1]}" =~ ^[0-9]+[.][0-9]+$ ]] || [ "${cpus[0]}" = "${cpus[1]}" ]; then
    usage_error "--cores needs two different CPUs (asrkit's, ESPnet's), not '$cores'"
  fi
  for c in "${cpus[@]}"; do
    taskset -c "$c" true 2> /dev/null || usage_error "--cores: CPU $c is not one this process may run on (taskset -c $c)"
  done
elif [ -n "$probe_from" ]; then
  usage_error "--probe-from belongs to --budget-minutes (an equal-time run's probe)"
elif [ -z "$epochs" ]; then
  usage_error "--epochs is required (or --budget-minutes) (see --help)"
fi
[ -z "$lm_decode_config" ] || [ -f "$lm_decode_config" ] \
  || usage_error "--lm-decode-config: $lm_decode_config: no such file"
[ -z "$lm_weights" ] || [ -n "$lm_decode_config" ] \
  || usage_error "--lm-weights tunes the fusion of --lm-decode-config's LM: give that too"
for v in $lm_weights $length_bonuses; do
  [[ "$v" =~ ^-?[0-9]+([.][0-9]+)?$ ]] || usage_error "--lm-weights and --length-bonuses take numbers, not '$v'"
done
for split in train dev test; do
  [ -d "$data/$split" ] || { echo "$0: $data/$split: no such Kaldi data dir" >&2; exit 1; }
done
tokenizer="${tokenizer:-$data/lang/tokenizer.json}"
cmvn="${cmvn:-$out/asrkit/cmvn.json}"
py="$root/.venv/bin/python"
esp="$root/.venv-espnet/bin/python"
[ -x "$py" ] || { echo "$0: no $py (run make install)" >&2; exit 1; }
[ -x "$esp" ] || { echo "$0: no $esp (run tools/espnet/setup_espnet_env.sh)" >&2; exit 1; }
helper="$root/tools/espnet/espnet_bench.py"
data="$(cd "$data" && pwd)"
mkdir -p "$out/espnet" "$out/asrkit"
out="$(cd "$out" && pwd)"
export OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads"

log() { echo "$(date '+%Y-%m-%d %H:%M:%S') [stage $1] ${*:2}"; }
run_stage() { [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; }
esp_data_opts() {  # ESPnet's input options for the train and valid (dev) dirs
  echo --train_data_path_and_name_and_type "$data/train/wav.scp,speech,sound" \
    --train_data_path_and_name_and_type "$data/train/text,text,text" \
    --valid_data_path_and_name_and_type "$data/dev/wav.scp,speech,sound" \
    --valid_data_path_and_name_and_type "$data/dev/text,text,text"
}
esp_text_opts="--use_preprocessor true --token_type char --token_list $out/espnet/tokens.txt
  --non_linguistic_symbols none --cleaner none --g2p none --ngpu 0"
stats="$out/espnet/stats"
budget_tool="$root/tools/espnet/espnet_budget.py"
# The configs stage 0 writes: the run's, or in the equal-time mode the probe's (stage 3 writes the run's).
if [ -n "$budget_minutes" ]; then
  conf_dir="$out/probe/espnet"; conf_epochs="$probe_epochs"; asrkit_sets="$out/probe/asrkit/overrides.txt"
else
  conf_dir="$out/espnet"; conf_epochs="$epochs"; asrkit_sets="$out/asrkit/overrides.txt"
fi
mkdir -p "$conf_dir" "$(dirname "$asrkit_sets")"

espnet_train() {  # CONFIG EXP_DIR LOG RECORD_NAME [CPU]: ESPnet training, timed (pinned to CPU if given)
  local conf=$1 exp=$2 log=$3 name=$4 pin=() norm_opt=()
  [ -z "${5:-}" ] || pin=(taskset -c "$5")
  if grep -q '^normalize: global_mvn' "$conf"; then
    norm_opt=(--normalize_conf "stats_file=$stats/train/feats_stats.npz")
  fi
  # shellcheck disable=SC2046,SC2086
  "${pin[@]}" "$py" "$helper" timed --record "$out/timings.json" --name "$name" -- \
    bash -c '"$@" > "'"$log"'" 2>&1' _ \
    "$esp" -m espnet2.bin.asr_train $esp_text_opts $(esp_data_opts) \
    --train_shape_file "$stats/train/speech_shape" --train_shape_file "$stats/train/text_shape.char" \
    --valid_shape_file "$stats/valid/speech_shape" --valid_shape_file "$stats/valid/text_shape.char" \
    --resume true --output_dir "$exp" --config "$conf" "${norm_opt[@]}" \
    || { tail -n 30 "$log" >&2; return 1; }
}

asrkit_train() {  # OVERRIDES EXP_DIR RECORD_NAME [CPU]: asrkit training, timed (pinned to CPU if given)
  local sets=() cmvn_opt=() pin=() kv
  while read -r kv; do [ -z "$kv" ] || sets+=(--set "$kv"); done < "$1"
  [ "$cmvn" = none ] || cmvn_opt=(--cmvn "$cmvn")
  [ -z "${4:-}" ] || pin=(taskset -c "$4")
  "${pin[@]}" "$py" "$helper" timed --record "$out/timings.json" --name "$3" -- \
    "$root/.venv/bin/asrkit" train --config "$asrkit_config" --train-data "$data/train" --valid-data "$data/dev" \
    --out "$2" --tokenizer "$tokenizer" "${cmvn_opt[@]}" "${sets[@]}"
}

fresh() {  # DIR RECORD_NAME: an equal-time training not yet timed starts from nothing (no resume: wall time counts)
  grep -qs "\"$2\":" "$out/timings.json" || rm -rf "$1"
}

train_both() {  # ASRKIT_SETS ASRKIT_EXP ESPNET_CONF ESPNET_EXP ESPNET_LOG SUFFIX: both at once, one CPU each
  fresh "$2" "asrkit_$6"
  fresh "$4" "espnet_$6"
  asrkit_train "$1" "$2" "asrkit_$6" "${cpus[0]}" & local a=$!
  espnet_train "$3" "$4" "$5" "espnet_$6" "${cpus[1]}" & local e=$!
  local rc=0
  wait "$a" || { echo "$0: asrkit's training ($2) failed" >&2; rc=1; }
  wait "$e" || { echo "$0: ESPnet's training ($4) failed" >&2; rc=1; }
  return "$rc"
}

if run_stage 0; then
  log 0 "ESPnet config from $asrkit_config ($conf_epochs epochs${overrides:+, $overrides}) into $conf_dir"
  set_opts=()
  for kv in $overrides; do set_opts+=(--set "$kv"); done
  if [ "$cmvn" = "$out/asrkit/cmvn.json" ] && [ ! -f "$cmvn" ]; then
    log 0 "global CMVN stats for $asrkit_config into $cmvn"
    "$py" -m asrkit compute-cmvn --config "$asrkit_config" "${set_opts[@]}" --max-utts 500 --no-progress \
      "$data/train" "$cmvn"
  fi
  cmvn_opt=()
  [ "$cmvn" = none ] || { [ -f "$cmvn" ] || { echo "$0: $cmvn: no CMVN stats (or --cmvn none)" >&2; exit 1; }
                          cmvn_opt=(--cmvn); }
  "$py" "$helper" config --asrkit-config "$asrkit_config" --epochs "$conf_epochs" --train "$data/train" \
    --out "$conf_dir" "${cmvn_opt[@]}" "${set_opts[@]}"
  cp "$conf_dir/asrkit_overrides.txt" "$asrkit_sets"
  "$py" "$helper" tokens --tokenizer "$tokenizer" --out "$out/espnet/tokens.txt"
fi

if run_stage 1; then
  log 1 "ESPnet collect_stats into $stats"
  # shellcheck disable=SC2046,SC2086
  "$esp" -m espnet2.bin.asr_train --collect_stats true $esp_text_opts $(esp_data_opts) \
    --train_shape_file "$data/train/wav.scp" --valid_shape_file "$data/dev/wav.scp" \
    --config "$conf_dir/asr.yaml" --normalize none --output_dir "$stats" > "$out/espnet/collect_stats.log" 2>&1 \
    || { tail -n 30 "$out/espnet/collect_stats.log" >&2; exit 1; }
  "$py" "$helper" text-shapes --stats "$stats" --token-list "$out/espnet/tokens.txt"
fi

if run_stage 2 && [ -z "$budget_minutes" ]; then
  log 2 "ESPnet training ($epochs epochs) into $out/espnet/exp; log: $out/espnet/train.log"
  espnet_train "$out/espnet/asr.yaml" "$out/espnet/exp" "$out/espnet/train.log" espnet_train
elif run_stage 2 && [ -n "$probe_from" ]; then
  log 2 "the probe of $probe_from reused (its logs and wall times) in $out/probe"
  "$py" "$budget_tool" reuse-probe --from "$probe_from" --out-dir "$out"
elif run_stage 2; then
  log 2 "the probe: both toolkits train $probe_epochs epochs at once (asrkit on CPU ${cpus[0]}, ESPnet on CPU" \
    "${cpus[1]}) into $out/probe"
  train_both "$asrkit_sets" "$out/probe/asrkit/exp" "$out/probe/espnet/asr.yaml" "$out/probe/espnet/exp" \
    "$out/probe/espnet/train.log" probe
fi

if run_stage 3 && [ -z "$budget_minutes" ]; then
  log 3 "asrkit training ($epochs epochs) into $out/asrkit/exp; log: $out/asrkit/exp/train.log"
  asrkit_train "$out/asrkit/overrides.txt" "$out/asrkit/exp" asrkit_train
elif run_stage 3; then
  fits="$("$py" "$budget_tool" plan --budget-minutes "$budget_minutes" --probe-epochs "$probe_epochs" \
          --out-dir "$out" --cores "${cpus[*]}")"
  read -r asrkit_epochs espnet_epochs <<< "$fits"
  log 3 "$budget_minutes minutes each ($out/budget.json): asrkit $asrkit_epochs epochs, ESPnet $espnet_epochs;" \
    "both train at once into $out/{asrkit,espnet}/exp"
  set_opts=()
  for kv in $overrides; do set_opts+=(--set "$kv"); done
  cmvn_opt=()
  [ "$cmvn" = none ] || cmvn_opt=(--cmvn)
  "$py" "$helper" config --asrkit-config "$asrkit_config" --epochs "$espnet_epochs" \
    --asrkit-epochs "$asrkit_epochs" --train "$data/train" --out "$out/espnet" "${cmvn_opt[@]}" "${set_opts[@]}"
  cp "$out/espnet/asrkit_overrides.txt" "$out/asrkit/overrides.txt"
  train_both "$out/asrkit/overrides.txt" "$out/asrkit/exp" "$out/espnet/asr.yaml" "$out/espnet/exp" \
    "$out/espnet/train.log" train
fi
espnet_epochs="$epochs"
if [ -n "$budget_minutes" ] && { run_stage 4 || run_stage 7; }; then
  fits="$("$py" "$budget_tool" show --plan "$out/budget.json")"
  read -r _ espnet_epochs <<< "$fits"
fi

if run_stage 4; then
  # Two decodings of the same model: ESPnet's own beam-1 search (label-synchronous CTC prefix search, not best
  # path) and best path, the rule asrkit's greedy decode uses, which the WER ratio is taken against.
  log 4 "ESPnet beam-1 CTC prefix search of $data/test (asr_inference, ctc_weight 1.0, no LM) into decode_test"
  "$esp" -m espnet2.bin.asr_inference --ngpu 0 --batch_size 1 --nbest 1 --beam_size 1 --ctc_weight 1.0 \
    --lm_weight 0.0 --penalty 0.0 --data_path_and_name_and_type "$data/test/wav.scp,speech,sound" \
    --key_file "$data/test/wav.scp" --asr_train_config "$out/espnet/exp/config.yaml" \
    --asr_model_file "$out/espnet/exp/${espnet_epochs}epoch.pth" --output_dir "$out/espnet/decode_test" \
    > "$out/espnet/decode_test.log" 2>&1 || { tail -n 30 "$out/espnet/decode_test.log" >&2; exit 1; }
  log 4 "ESPnet best-path CTC decoding of $data/test into decode_test_greedy"
  "$esp" "$helper" greedy --config "$out/espnet/exp/config.yaml" --model "$out/espnet/exp/${espnet_epochs}epoch.pth" \
    --data "$data/test" --out "$out/espnet/decode_test_greedy" 2> "$out/espnet/decode_test_greedy.log" \
    || { tail -n 30 "$out/espnet/decode_test_greedy.log" >&2; exit 1; }
  if [ -n "$lm_decode_config" ]; then
    log 4 "ESPnet's CTC log-probabilities of $data/test, decoded by asrkit's search as $lm_decode_config says" \
      "into decode_test_lm"
    "$esp" "$helper" posteriors --config "$out/espnet/exp/config.yaml" \
      --model "$out/espnet/exp/${espnet_epochs}epoch.pth" --data "$data/test" --out "$out/espnet/posteriors_test" \
      2> "$out/espnet/posteriors_test.log" || { tail -n 30 "$out/espnet/posteriors_test.log" >&2; exit 1; }
    esp_decode_config="$lm_decode_config"
    if [ -n "$lm_weights" ]; then
      log 4 "ESPnet's LM weight and length bonus chosen on $data/dev (its posteriors) into tune_dev"
      "$esp" "$helper" posteriors --config "$out/espnet/exp/config.yaml" \
        --model "$out/espnet/exp/${espnet_epochs}epoch.pth" --data "$data/dev" --out "$out/espnet/posteriors_dev" \
        2> "$out/espnet/posteriors_dev.log" || { tail -n 30 "$out/espnet/posteriors_dev.log" >&2; exit 1; }
      # shellcheck disable=SC2086  # the grids are lists of numbers (checked above)
      "$py" "$root/tools/espnet/espnet_lm.py" --posteriors "$out/espnet/posteriors_dev" --tokenizer "$tokenizer" \
        --decode-config "$lm_decode_config" --tune-ref "$data/dev/text" --lm-weights $lm_weights \
        --length-bonuses $length_bonuses --out "$out/espnet/tune_dev"
      esp_decode_config="$out/espnet/tune_dev/decode.yaml"
    fi
    "$py" "$root/tools/espnet/espnet_lm.py" --posteriors "$out/espnet/posteriors_test" --tokenizer "$tokenizer" \
      --decode-config "$esp_decode_config" --out "$out/espnet/decode_test_lm"
  fi
fi

if run_stage 5; then
  log 5 "asrkit greedy CTC decoding of $data/test"
  "$root/.venv/bin/asrkit" decode --model "$out/asrkit/exp" --data "$data/test" --out "$out/asrkit/decode_test"
  if [ -n "$lm_decode_config" ]; then
    asrkit_decode_config="$lm_decode_config"
    if [ -n "$lm_weights" ]; then
      log 5 "asrkit's LM weight and length bonus chosen on $data/dev into tune_dev"
      # shellcheck disable=SC2086  # the grids are lists of numbers (checked above)
      "$root/.venv/bin/asrkit" tune-fusion --model "$out/asrkit/exp" --data "$data/dev" \
        --decode-config "$lm_decode_config" --lm-weights $lm_weights --length-bonuses $length_bonuses \
        --out "$out/asrkit/tune_dev"
      asrkit_decode_config="$out/asrkit/tune_dev/decode.yaml"
    fi
    log 5 "asrkit decoding of $data/test as $asrkit_decode_config says into decode_test_lm"
    "$root/.venv/bin/asrkit" decode --model "$out/asrkit/exp" --data "$data/test" \
      --decode-config "$asrkit_decode_config" --out "$out/asrkit/decode_test_lm"
  fi
fi

if run_stage 6; then
  log 6 "per-step time on identical batches (asrkit, ESPnet, asrkit, ESPnet) into $out/step_time.json"
  rm -f "$out/step_time.json"
  for _ in 1 2; do
    "$py" "$root/tools/espnet/espnet_step_time.py" --toolkit asrkit --out "$out" --data "$data"
    "$esp" "$root/tools/espnet/espnet_step_time.py" --toolkit espnet --out "$out" --data "$data" 2>> "$out/espnet/step_time.log"
  done
fi

if run_stage 7; then
  log 7 "scoring; table in $out/results.md"
  run_opts=(--epochs "$epochs")
  [ -z "$budget_minutes" ] || run_opts=(--budget-plan "$out/budget.json")
  "$py" "$root/tools/espnet/espnet_report.py" --out "$out" --data "$data" "${run_opts[@]}" --threads "$threads"
fi
