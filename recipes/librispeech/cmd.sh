# How long-running commands are launched. Single GPU/CPU: run directly.
# Several GPUs on one node: train_cmd="torchrun --standalone --nproc_per_node=4"
# (run.sh then runs the asrkit script under torchrun, one process per GPU).
export train_cmd=""
