#!/bin/sh
# The GPU checks as one run on a lent CUDA machine that reaches no package registry
# (bench/results/gpu.md): install the wheels found in WHEELS (the pinned versions of
# requirements.lock the machine's image lacks, downloaded for its Python, and this repository's
# wheel), then run the STEPS, most wanted first, each under its own time limit, results in OUT.
#
#   [STEPS="pipeline direct demo check"] [N=8000] [DEVICE=cuda] sh bench/gpu_device.sh WHEELS OUT [FASHION_DIR]
#
#   pipeline  bench.gpu_pipeline: adds/s end to end against the backbone's images/s, 1, 2 and 4
#             featurizer processes and 2 ledger workers, adds through the router (issue 29)
#   direct    the same, adds produced by head (UNLEARN_ROUTE_BY_HEAD)
#   demo      `unlearn demo` with UNLEARN_DEVICE=cuda (Fashion-MNIST when FASHION_DIR holds the
#             train split, else sklearn digits)
#   check     bench.gpu_check: backbones on CUDA against the CPU, q compared (issue 23)
#
# FASHION_DIR holds Fashion-MNIST idx.gz files (Debian's dataset-fashion-mnist layout); the test
# split alone serves the pipeline steps. Without it they use random images of the same size.
set -u
WHEELS=$1
OUT=$2
FASHION=${3:-}
STEPS=${STEPS:-pipeline direct demo check}
N=${N:-8000}
DEVICE=${DEVICE:-cuda}  # cpu: a dry run of this script on a machine without a GPU
SITE=/tmp/unlearn-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl || exit 1
# This repository itself: built here unless WHEELS already holds its wheel (pip wheel . elsewhere).
ls "$WHEELS"/unlearn_stream-*.whl >/dev/null 2>&1 ||
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" . || exit 1
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [ -n "$FASHION" ]; then
    mkdir -p /usr/share/datasets/fashion-mnist && cp "$FASHION"/*.gz /usr/share/datasets/fashion-mnist/
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/nvidia-smi.txt" 2>&1
python3 -c "import torch, unlearn.services.cli, unlearn.streams.featurizer.service, unlearn.streams.ledger.worker;\
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.is_available() and torch.cuda.get_device_name(0))" \
    2>&1 | tee "$OUT/imports.txt"
for step in $STEPS; do
    case $step in
    pipeline | direct)
        flag=""; [ "$step" = direct ] && flag=--direct
        echo "== bench.gpu_pipeline $flag (1, 2, 4 featurizers on $DEVICE, $N images)"
        timeout 300 python3 -m bench.gpu_pipeline --device "$DEVICE" --n "$N" --featurizers 1,2,4 --heads 8 \
            --partitions 8 --ledgers 2 --timeout 120 --ragged $flag --json "$OUT/gpu_$step.json" 2>&1 | grep --line-buffered -v "^%" |
            tee "$OUT/gpu_$step.log" ;;
    demo)
        echo "== demo with UNLEARN_DEVICE=cuda"
        dataset=digits; [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] && dataset=fashion
        UNLEARN_DEVICE=$DEVICE timeout 200 python3 -m unlearn.services.cli demo --dataset $dataset --timeout 120 \
            --out /tmp/unlearn-demo >"$OUT/demo.log" 2>&1
        echo "demo exit: $?" | tee -a "$OUT/demo.log"
        tail -n 25 "$OUT/demo.log"
        cp /tmp/unlearn-demo/report.json "$OUT/demo_report.json" 2>/dev/null
        grep -h "loaded on\|ERROR\|Traceback" /tmp/unlearn-demo/logs/*.log | head -20 ;;
    check)
        echo "== bench.gpu_check"
        timeout 180 python3 -m bench.gpu_check --json "$OUT/gpu_check.json" 2>&1 | grep --line-buffered -v "Loading weights" |
            tee "$OUT/gpu_check.log" ;;
    *) echo "unknown step $step" ;;
    esac
done
