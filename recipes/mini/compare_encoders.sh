#!/usr/bin/env bash
# Transformer vs Conformer, each plain, with InterCTC and with Deja-vu (the paper's iterated loss and
# re-presentation), trained on the mini recipe's data with the same epochs, decoded greedily on data/test.
# Needs stages 0-2 of run.sh in --workdir. Prints one table row per model: WER, CER, training seconds.
#
#   bash recipes/mini/compare_encoders.sh --workdir DIR [--seeds "1 2 3"] [--epochs 10]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

workdir="$here"
seeds="1"
epochs=10
config="$root/conf/tiny_ctc.yaml"
. "$root/tools/parse_options.sh"
cd "$workdir"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

interctc="--set model.encoder.interctc_layers=[2] --set model.interctc_weight=0.3"
dejavu="--set model.encoder.dejavu_layer=2 --set model.intermediate_loss=iterated --set model.interctc_weight=0.3"
declare -A variants=(
  [transformer]=""
  [transformer_interctc]="$interctc"
  [transformer_dejavu]="$dejavu"
  [conformer]="--set model.encoder.kind=conformer"
  [conformer_interctc]="--set model.encoder.kind=conformer $interctc"
  [conformer_dejavu]="--set model.encoder.kind=conformer $dejavu"
)

printf "| model | seed | WER %% | CER %% | train s |\n| --- | --- | --- | --- | --- |\n"
for name in transformer transformer_interctc transformer_dejavu conformer conformer_interctc conformer_dejavu; do
  for seed in $seeds; do
    exp="exp/compare/${name}_seed$seed"
    mkdir -p exp/compare
    start=$(date +%s)
    # shellcheck disable=SC2086  # the variant's --set options are meant to split
    asrkit train --config "$config" --train-data data/train --valid-data data/dev --out "$exp" \
      --tokenizer data/lang/tokenizer.json --cmvn data/lang/cmvn.json --set "train.epochs=$epochs" \
      --set "train.seed=$seed" ${variants[$name]} > "$exp.log" 2>&1
    seconds=$(( $(date +%s) - start ))
    asrkit decode --model "$exp" --data data/test --out "$exp/decode_test" >> "$exp.log" 2>&1
    wer=$(asrkit score --ref data/test/text --hyp "$exp/decode_test/text" | head -n 1)
    cer=$(asrkit score --ref data/test/text --hyp "$exp/decode_test/text" --cer | head -n 1)
    printf "| %s | %s | %s | %s | %s |\n" "$name" "$seed" "$(echo "$wer" | awk '{print $2}')" \
      "$(echo "$cer" | awk '{print $2}')" "$seconds"
  done
done
