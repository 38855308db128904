#!/usr/bin/env bash
# The checks that need a GPU, in one call, before the paper grid is started on one:
#
#   bash tools/gpucheck.sh [OUT]          # OUT (default gpucheck/) receives one log per check and summary.txt
#
# 1. The compile check, fp32 and bf16 (tests/test_compile.py's GPU tests): ER, DER++, CoCa and CLS-ER trained eager
#    and compiled (CUDA graphs) side by side on seq-cifar10's real stream with deterministic kernels: the same losses
#    to rounding; then `python -m gcl.bench compile` with CUDA's usual kernels, fp32: the speed-up training sees.
# 2. One MNIST-360 seed at full MNIST's size, compiled, with dynamo's recompilations logged (TORCH_LOGS=recompiles):
#    a stream of many batch sizes must compile a handful of graphs, not one per size.
# 3. `python -m gcl.bench grid` with several processes sharing the GPU under NVIDIA's MPS (started if it is
#    installed): what the paper grid costs on this card.
# 4. Seeds stacked on the ResNet-18 (grouped convolutions, eager) against the same seeds alone, 5 and 10 seeds of ER,
#    DER++, CoCa and CLS-ER on seq-cifar10's shapes: ms per seed-step of each, what `stack: true` gains on this card;
#    beside it as many lone processes sharing the card under MPS (`gcl.bench grid --processes 5` and 10), the other
#    way to fill it.
# 5. The dry run of one image cell on the GPU at full width, bf16 and compiled, through `dvc repro`.
# 6. Optional, where GCL_CIFAR10_FOLDER names a copy of CIFAR-10 as an image folder (a folder, or a .tar.gz / .zip of
#    one: train/<class>/, test/<class>/): seq-cifar10's ER, DER++ and CoCa at buffer 500 trained on its real images at
#    the paper's length (50 epochs), 1 seed, through `dvc repro` of profiles/cifar10-folder.yaml in a workspace of its
#    own ($OUT/folder-cifar10: its results/tables.md puts the paper's numbers beside them). Say which copy it was.
#
# Needs the project installed (pip install -e '.[test]': pytest runs check 1) and an NVIDIA GPU; each check has a time
# limit, and the exit status is the number of checks that failed. Every figure it prints belongs to the card named in
# summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpucheck}
mkdir -p "$out"
failed=0

check() {   # check NAME LIMIT_SECONDS COMMAND...: run it, log it, say how it ended
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    if timeout "$limit" "$@" > "$out/$name.log" 2>&1; then
        echo "ok      $name ($((SECONDS - start)) s)" | tee -a "$out/summary.txt"
    else
        echo "FAILED  $name (exit $?, $((SECONDS - start)) s): see $out/$name.log" | tee -a "$out/summary.txt"
        failed=$((failed + 1))
    fi
}

{
    echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
} > "$out/summary.txt"
cat "$out/summary.txt"

# a process of its own: cuBLAS reads its deterministic workspace setting at its first use
check compile-equal-fp32 900 python -m pytest -q -m "" -p no:cacheprovider tests/test_compile.py -k "on_the_gpu and fp32"
check compile-equal-bf16 900 python -m pytest -q -m "" -p no:cacheprovider tests/test_compile.py -k "on_the_gpu and bf16"
check compile-speed 900 python -m gcl.bench compile --benchmarks seq-cifar10 --methods er,derpp,coca,clser --device cuda
check mnist360-recompiles 900 env TORCH_LOGS=recompiles python -m gcl.dryrun profiles/paper.yaml \
    --runs mnist-360-clser-200 --scale 1 --device cuda --compile true --workspace "$out/dry-mnist360" --fresh
nvidia-cuda-mps-control -d > /dev/null 2>&1 || true   # the grid's processes share the GPU better under MPS
check grid-4-processes 900 python -m gcl.bench grid --benchmarks seq-cifar10 --methods er,derpp,coca --processes 4 \
    --device cuda --steps 100
for seeds in 5 10; do
    check "stacked-resnet-$seeds" 900 python -m gcl.bench steps --stacked "$seeds" --backbone resnet18 --device cuda \
        --per-class 200 --methods er,derpp,coca,clser
    check "grid-$seeds-processes" 900 python -m gcl.bench grid --benchmarks seq-cifar10 --methods er,derpp,coca \
        --processes "$seeds" --device cuda --steps 100
done
check dryrun-image-cell 900 python -m gcl.dryrun profiles/paper.yaml --runs seq-cifar10-coca-200 --device cuda --bf16 \
    --width 64 --pooled-size 64 --workspace "$out/dry-image" --fresh
if [ -n "${GCL_CIFAR10_FOLDER:-}" ]; then
    ws=$(realpath -m "$out/folder-cifar10")
    rm -rf "$ws" && mkdir -p "$ws/.dvc" && cp -r dvc.yaml .dvcignore stages src reference reproductions "$ws/" \
        && cp .dvc/config "$ws/.dvc/config" && (cd "$ws" && git init -q)
    # the profile with the folder's path, seed 0 and its buffer-500 runs (ER, DER++, CoCa), 50 epochs as it says
    python - "$ws/params.yaml" <<'PY'
import os, sys, yaml
params = yaml.safe_load(open("profiles/cifar10-folder.yaml"))
params["sources"]["cifar10-folder"]["path"] = os.path.abspath(os.environ["GCL_CIFAR10_FOLDER"])
params["seeds"] = [0]
params["runs"] = {key: run for key, run in params["runs"].items() if run["buffer"] == 500}
yaml.safe_dump(params, open(sys.argv[1], "w"), sort_keys=False)
PY
    check folder-seq-cifar10-500 10800 bash -c 'cd "$1" && PYTHONPATH="$1/src" dvc repro' _ "$ws"
    grep -A12 "seq-cifar10" "$ws/results/tables.md" 2>/dev/null | head -30 > "$out/folder-cifar10.txt" || true
fi
grep -h "recompil" "$out/mnist360-recompiles.log" "$out"/dry-mnist360/logs/*.log 2>/dev/null | head -20 \
    > "$out/recompiles.txt"
echo "recompilations logged: $(wc -l < "$out/recompiles.txt") line(s) (first 20 in $out/recompiles.txt)" | tee -a "$out/summary.txt"
exit "$failed"
