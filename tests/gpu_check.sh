#!/usr/bin/env bash
# The check for a lent GPU (one H200, 6 minutes), in one command, offline:   bash tests/gpu_check.sh
# 1. the GPU tests (tests/test_gpu.py, tests/test_kernels.py; 8 processes where pytest-xdist is installed), while
# 2. the two paper configs train 10 iterations compiled (config/krause_gpt.py, config/tda_gpt.py; 2 layers, on
#    tiny-shakespeare characters or, without ../shared/data, on this repo's own text): each must exit 0 and print
#    an `attention:` line naming the Triton kernel; then, on the idle GPU,
# 3. each rule's kernel beside flash softmax, one bench.py run per case (tests/gpu_check.py), and one table of it all
#    to paste into docs/RESULTS.md. Exit status 1 where a test or a train run failed or timed out; a missed speed
#    bar is only reported. Each step has a timeout, and the whole ends within GPU_CHECK_SECONDS (default 350).
# GPU_CHECK_CPU=1: the same steps on the CPU at tiny sizes (a dry run of this script; no kernel is timed).
set -u
cd "$(dirname "$0")/.." || exit 1
LOG=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
date +%s > "$LOG/start.txt"
DEADLINE=$(( $(cat "$LOG/start.txt") + ${GPU_CHECK_SECONDS:-350} - 10 ))  # 10 s for the table
echo "gpu_check: logs in $LOG; every step ends by $(date -d "@$DEADLINE" +%T)"

step() {  # step NAME LIMIT_S COMMAND...: COMMAND under timeout(1), its output in $LOG/NAME.log, its status NAME.rc
    local name=$1 left=$(( DEADLINE - $(date +%s) )) limit=$2
    shift 2
    (( left < limit )) && limit=$left
    (( limit < 1 )) && limit=1  # timeout 0 would mean none
    echo "$*" > "$LOG/$name.cmd"
    echo "$limit" > "$LOG/$name.limit"
    echo "[$(date +%T)] $name: at most $limit s: $*"
    timeout -k 5 "$limit" "$@" > "$LOG/$name.log" 2>&1  # the whole process group: compile workers too
    echo $? > "$LOG/$name.rc"
    echo "[$(date +%T)] $name: exit $(cat "$LOG/$name.rc")"
}

# 1. the tests: 8 processes compile the kernels' cases side by side (one by one took over 300 s for 16 of them)
# (each process compiling in itself, TORCHINDUCTOR_COMPILE_THREADS=1: not 8 pools of a worker per core)
TESTS=(tests/test_gpu.py tests/test_kernels.py)
if python -c "import xdist" 2>/dev/null; then
    step tests 200 env TORCHINDUCTOR_COMPILE_THREADS=1 python -m pytest -q -n 8 --dist load "${TESTS[@]}" &
else
    step tests 200 python -m pytest -q -o addopts= "${TESTS[@]}" &
fi

# 2. the paper configs as they are (their forward path on CUDA: the Triton kernel), 2 layers, on local text only,
# as a lent GPU has no network
SOURCE=$(realpath -m ../shared/data/tinyshakespeare/input.txt)
if [ ! -f "$SOURCE" ]; then
    SOURCE=$LOG/text.txt
    cat ./*.py docs/*.md > "$SOURCE"
    echo "no ../shared/data here: the train runs read this repo's own text ($(wc -c < "$SOURCE") characters)"
fi
TRAIN=(--dataset=shakespeare_char "--data_source=$SOURCE" --compile=True --n_layer=2
       --batch_size=8 --gradient_accumulation_steps=1 --max_iters=10 --eval_interval=10 --eval_iters=2
       --log_interval=1 --warmup_iters=2 --lr_decay_iters=10 --hellaswag=False)
[ -n "${GPU_CHECK_CPU:-}" ] && TRAIN+=(--device=cpu --block_size=256 --batch_size=2 --max_iters=2 --eval_interval=2
                                      --eval_iters=1 --warmup_iters=1 --lr_decay_iters=2)
for rule in krause tda; do
    step "train_$rule" 150 python train.py "config/${rule}_gpt.py" "${TRAIN[@]}" "--data_dir=$LOG/data_$rule" \
        "--out_dir=$LOG/out_$rule" &
done
wait
rm -rf "$LOG"/out_* "$LOG"/data_*  # their checkpoints and data: what the check needs is in the logs

# 3. the pace table, alone on the GPU, then the table of everything
python tests/gpu_check.py "--log=$LOG" "--deadline=$DEADLINE" ${GPU_CHECK_CPU:+--cpu}
