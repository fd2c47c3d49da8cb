#!/usr/bin/env bash
# Side-by-side benchmark against ESPnet2 (issue 12): train both toolkits on the same Kaldi data dirs with the
# same model, features, SpecAugment, optimizer, schedule and epochs; decode CTC without an LM (both by best
# path, and ESPnet also by its own beam-1 prefix search); print one table of WER/CER (asrkit's scorer on the
# same references) and training throughput (audio seconds per second). tools/espnet/bench_espnet_audit.md: what
# differs between the two at tiny_ctc.yaml.
#
# Usage: tools/espnet/bench_espnet.sh --asrkit-config conf/tiny_ctc.yaml --data DIR --epochs N --out DIR
#                              [--threads 1] [--stage 0] [--stop-stage 100]
#                              [--tokenizer DIR/lang/tokenizer.json] [--cmvn FILE | none]
#                              [--overrides "KEY=VALUE ..."]
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
#   stage 6: per-step time of both on identical batches (tools/espnet/espnet_step_time.py, interleaved, 2 rounds)
#   stage 7: score all three decodings, print the table and write it to OUT/results.md
#            (tools/espnet/espnet_report.py); the asrkit / ESPnet WER ratio is taken against ESPnet's best path (the
#            same rule as asrkit's) and also printed against its prefix search
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
. "$root/tools/parse_options.sh"
[ $# -eq 0 ] || { echo "$0: unexpected argument '$1' (see --help)" >&2; exit 2; }
for v in asrkit_config data epochs out; do
  [ -n "${!v}" ] || { echo "$0: --${v//_/-} is required (see --help)" >&2; exit 2; }
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

if run_stage 0; then
  log 0 "ESPnet config from $asrkit_config ($epochs epochs${overrides:+, $overrides}) into $out/espnet"
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
  "$py" "$helper" config --asrkit-config "$asrkit_config" --epochs "$epochs" --train "$data/train" \
    --out "$out/espnet" "${cmvn_opt[@]}" "${set_opts[@]}"
  cp "$out/espnet/asrkit_overrides.txt" "$out/asrkit/overrides.txt"
  "$py" "$helper" tokens --tokenizer "$tokenizer" --out "$out/espnet/tokens.txt"
fi

if run_stage 1; then
  log 1 "ESPnet collect_stats into $stats"
  # shellcheck disable=SC2046,SC2086
  "$esp" -m espnet2.bin.asr_train --collect_stats true $esp_text_opts $(esp_data_opts) \
    --train_shape_file "$data/train/wav.scp" --valid_shape_file "$data/dev/wav.scp" \
    --config "$out/espnet/asr.yaml" --normalize none --output_dir "$stats" > "$out/espnet/collect_stats.log" 2>&1 \
    || { tail -n 30 "$out/espnet/collect_stats.log" >&2; exit 1; }
  "$py" "$helper" text-shapes --stats "$stats" --token-list "$out/espnet/tokens.txt"
fi

if run_stage 2; then
  log 2 "ESPnet training ($epochs epochs) into $out/espnet/exp; log: $out/espnet/train.log"
  norm_opt=()
  if grep -q '^normalize: global_mvn' "$out/espnet/asr.yaml"; then
    norm_opt=(--normalize_conf "stats_file=$stats/train/feats_stats.npz")
  fi
  # shellcheck disable=SC2046,SC2086
  "$py" "$helper" timed --record "$out/timings.json" --name espnet_train -- \
    bash -c '"$@" > "'"$out"'/espnet/train.log" 2>&1' _ \
    "$esp" -m espnet2.bin.asr_train $esp_text_opts $(esp_data_opts) \
    --train_shape_file "$stats/train/speech_shape" --train_shape_file "$stats/train/text_shape.char" \
    --valid_shape_file "$stats/valid/speech_shape" --valid_shape_file "$stats/valid/text_shape.char" \
    --resume true --output_dir "$out/espnet/exp" --config "$out/espnet/asr.yaml" "${norm_opt[@]}" \
    || { tail -n 30 "$out/espnet/train.log" >&2; exit 1; }
fi

if run_stage 3; then
  log 3 "asrkit training ($epochs epochs) into $out/asrkit/exp; log: $out/asrkit/exp/train.log"
  sets=()
  while read -r kv; do [ -z "$kv" ] || sets+=(--set "$kv"); done < "$out/asrkit/overrides.txt"
  cmvn_opt=()
  [ "$cmvn" = none ] || cmvn_opt=(--cmvn "$cmvn")
  "$py" "$helper" timed --record "$out/timings.json" --name asrkit_train -- \
    "$root/.venv/bin/asrkit" train --config "$asrkit_config" --train-data "$data/train" --valid-data "$data/dev" \
    --out "$out/asrkit/exp" --tokenizer "$tokenizer" "${cmvn_opt[@]}" "${sets[@]}"
fi

if run_stage 4; then
  # Two decodings of the same model: ESPnet's own beam-1 search (label-synchronous CTC prefix search, not best
  # path) and best path, the rule asrkit's greedy decode uses, which the WER ratio is taken against.
  log 4 "ESPnet beam-1 CTC prefix search of $data/test (asr_inference, ctc_weight 1.0, no LM) into decode_test"
  "$esp" -m espnet2.bin.asr_inference --ngpu 0 --batch_size 1 --nbest 1 --beam_size 1 --ctc_weight 1.0 \
    --lm_weight 0.0 --penalty 0.0 --data_path_and_name_and_type "$data/test/wav.scp,speech,sound" \
    --key_file "$data/test/wav.scp" --asr_train_config "$out/espnet/exp/config.yaml" \
    --asr_model_file "$out/espnet/exp/${epochs}epoch.pth" --output_dir "$out/espnet/decode_test" \
    > "$out/espnet/decode_test.log" 2>&1 || { tail -n 30 "$out/espnet/decode_test.log" >&2; exit 1; }
  log 4 "ESPnet best-path CTC decoding of $data/test into decode_test_greedy"
  "$esp" "$helper" greedy --config "$out/espnet/exp/config.yaml" --model "$out/espnet/exp/${epochs}epoch.pth" \
    --data "$data/test" --out "$out/espnet/decode_test_greedy" 2> "$out/espnet/decode_test_greedy.log" \
    || { tail -n 30 "$out/espnet/decode_test_greedy.log" >&2; exit 1; }
fi

if run_stage 5; then
  log 5 "asrkit greedy CTC decoding of $data/test"
  "$root/.venv/bin/asrkit" decode --model "$out/asrkit/exp" --data "$data/test" --out "$out/asrkit/decode_test"
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
  "$py" "$root/tools/espnet/espnet_report.py" --out "$out" --data "$data" --epochs "$epochs" --threads "$threads"
fi
