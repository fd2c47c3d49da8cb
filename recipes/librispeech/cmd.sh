# How long-running commands are launched; sourced by path.sh, so by run.sh.
#
# $train_cmd goes in front of stage 3's launcher: `asrkit`, or `torchrun ... -m asrkit` when run.sh is given
# --ngpu N > 1 (torchrun --standalone --nproc_per_node N) or --nnodes M > 1 (torchrun --nnodes M --nproc_per_node N
# --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID). Set it here or through $ASRKIT_TRAIN_CMD.
#
#   One machine, 1 or N GPUs (the default, nothing in front):
#     train_cmd=""                     run.sh --ngpu 8 ...
#   Slurm, one node: srun starts the launcher inside the allocation (salloc/sbatch) on a GPU node:
#     train_cmd="srun --nodes=1 --ntasks=1 --gpus-per-task=8 --cpus-per-task=32"
#                                      run.sh --ngpu 8 ...
#   Slurm, several nodes: one torchrun per node (--ntasks-per-node=1), each starting --ngpu processes; the first
#   node of the allocation hosts the c10d rendezvous; exp/ must be on a filesystem every node sees:
#     train_cmd="srun --nodes=4 --ntasks-per-node=1 --gpus-per-node=8 --cpus-per-task=32 --kill-on-bad-exit=1"
#     head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
#                                      run.sh --ngpu 8 --nnodes 4 --rdzv-endpoint "$head:29500" --rdzv-id "$SLURM_JOB_ID" ...
#   Without Slurm, several nodes: run the same `run.sh --stage 3 --stop-stage 3 --ngpu 8 --nnodes 4
#   --rdzv-endpoint node01:29500` on each node (train_cmd=""), after stages 1-2 on one of them.
# Stages other than 3 run where run.sh runs (decoding spreads over CPU processes with --nj).
export train_cmd="${ASRKIT_TRAIN_CMD:-}"
