#!/usr/bin/env bash
# Deja-vu at depth: the --size medium model (12-layer Conformer, conf/mini_medium.yaml) trained plain, with
# InterCTC, with the iterated loss alone and with Deja-vu (Tjandra et al.: the iterated loss and re-presentation
# of the input features), the same epochs and seeds, each decoded greedily and with the tuned word LM on test and
# test_unseen. The iterated arm is Deja-vu without the re-presentation (the same auxiliary MLP head, layer and
# weight), so a Deja-vu result traces to either half: iterated against plain is the loss, dejavu against iterated
# the re-presentation.
# Each method sets every intermediate-layer option itself, so the table does not depend on what the medium config
# holds (InterCTC at layer 6 since 2026-11-27).
# Needs stages 0-2 and 4 of `run.sh --size medium` in --workdir (data, tokenizer, CMVN, the LM). Each run is
# `run.sh --stage 3` then `--stage 5` into exp/dejavu/<method>_seed<N>; a run whose scores exist is kept
# (restartable). --reuse-seed1 METHOD=EXP lets a trained and scored experiment stand in for that method's seed 1
# (the medium recipe's own exp/medium is InterCTC seed 1): it is refused, naming the settings that differ, unless
# its config.yaml holds the method's settings, seed 1 and --train-opts (tools/config_matches.py).
# Prints one table: WER mean and spread over the seeds per method and test set (tools/seed_table.py).
#
#   bash recipes/mini/compare_dejavu.sh --workdir DIR [--methods "plain interctc iterated dejavu"] [--seeds "1 2 3"]
#        [--layer 6] [--weight 0.3] [--reuse-seed1 interctc=exp/medium] [--train-opts "--set ..."]
#        [--run-opts "--nproc 1 ..."]
#   --run-opts  more run.sh options for every run (the same for all methods)
#   --layer   the intermediate layer: InterCTC's loss, the iterated loss and Deja-vu's auxiliary loss +
#             re-presentation after it (the paper: the middle layer, 12 of 24; here 6 of 12)
#   --weight  lambda of the intermediate loss (the paper's 0.3)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

workdir="$here"
methods="plain interctc iterated dejavu"
seeds="1"
layer=6
weight=0.3
reuse_seed1=""
train_opts=""
run_opts=""
. "$root/tools/parse_options.sh"
cd "$workdir"

no_interctc="--set model.encoder.interctc_layers=[] --set model.encoder.self_condition=false"
declare -A method_opts=(
  [plain]="$no_interctc --set model.encoder.dejavu_layer=0 --set model.interctc_weight=0.0"
  [interctc]="--set model.encoder.interctc_layers=[$layer] --set model.encoder.dejavu_layer=0 --set model.intermediate_loss=interctc --set model.encoder.self_condition=false --set model.interctc_weight=$weight"
  [iterated]="--set model.encoder.interctc_layers=[$layer] --set model.encoder.dejavu_layer=0 --set model.intermediate_loss=iterated --set model.encoder.self_condition=false --set model.interctc_weight=$weight"
  [dejavu]="$no_interctc --set model.encoder.dejavu_layer=$layer --set model.intermediate_loss=iterated --set model.interctc_weight=$weight --set model.encoder.dejavu_input=stacked_fbank --set model.encoder.dejavu_combine=a"
)
reuse_method="${reuse_seed1%%=*}"
reuse_exp="${reuse_seed1#*=}"
if [ -n "$reuse_seed1" ]; then
  [ -n "${method_opts[$reuse_method]+set}" ] && [ -n "$reuse_exp" ] && [ "$reuse_exp" != "$reuse_seed1" ] ||
    { echo "$0: --reuse-seed1 must be METHOD=EXP with METHOD plain, interctc, iterated or dejavu, not '$reuse_seed1'" >&2; exit 1; }
  # shellcheck disable=SC2086  # the options are meant to split
  python "$root/tools/config_matches.py" "$reuse_exp/config.yaml" --set train.seed=1 ${method_opts[$reuse_method]} \
    $train_opts || { echo "$0: $reuse_exp is not $reuse_method seed 1 with these --train-opts (above)" >&2; exit 1; }
fi
exps=()
for method in $methods; do
  [ -n "${method_opts[$method]+set}" ] || { echo "$0: unknown method '$method' (plain, interctc, iterated, dejavu)" >&2; exit 1; }
  for seed in $seeds; do
    exp="exp/dejavu/${method}_seed$seed"
    exps+=("$method=$exp")
    if [ "$method" = "$reuse_method" ] && [ "$seed" = 1 ] && [ -n "$reuse_seed1" ] && [ ! -e "$exp" ]; then
      mkdir -p exp/dejavu && ln -s "$(cd "$reuse_exp" && pwd)" "$exp"
    fi
    if [ -s "$exp/decode_test_unseen_lm/scoring.log" ] || [ -s "$exp/decode_test_lm/scoring.log" ]; then
      echo "$exp: scored already, kept"
      continue
    fi
    # shellcheck disable=SC2086  # the options are meant to split
    bash "$here/run.sh" --size medium --workdir "$workdir" --exp "$exp" --stage 3 --stop-stage 3 $run_opts \
      --train-opts "--set train.seed=$seed ${method_opts[$method]} $train_opts"
    # shellcheck disable=SC2086
    bash "$here/run.sh" --size medium --workdir "$workdir" --exp "$exp" --stage 5 --stop-stage 7 $run_opts \
      > "$exp.log" 2>&1
  done
done
python "$root/tools/seed_table.py" "${exps[@]}"
