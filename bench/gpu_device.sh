#!/bin/sh
# The GPU check as one run on a lent CUDA machine that reaches no package registry
# (bench/results/gpu.md): install the pinned wheels found in WHEELS (the versions of
# requirements.lock, downloaded for that machine's Python) and this repository, then run
# bench.gpu_check, the demo end to end with the featurizer on CUDA, and bench.gpu_pipeline (issue
# 29: adds/s end to end against the backbone's images/s, with 1, 2 and 4 featurizer processes, through
# the router and produced by head). Results go to OUT.
#
#   sh bench/gpu_device.sh WHEELS OUT [FASHION_DIR]
#
# FASHION_DIR, if given, holds Fashion-MNIST idx.gz files (Debian's dataset-fashion-mnist
# layout); without it the demo falls back to sklearn digits and the check to digits images.
set -u
WHEELS=$1
OUT=$2
FASHION=${3:-}
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
echo "== bench.gpu_check"
timeout 180 python3 -m bench.gpu_check --json "$OUT/gpu_check.json" 2>&1 | grep -v "Loading weights" | tee "$OUT/gpu_check.log"
echo "== demo with UNLEARN_DEVICE=cuda"
UNLEARN_DEVICE=cuda timeout 240 python3 -m unlearn.services.cli demo --dataset fashion --timeout 120 --out /tmp/unlearn-demo \
    >"$OUT/demo.log" 2>&1
echo "demo exit: $?" | tee -a "$OUT/demo.log"
tail -n 25 "$OUT/demo.log"
cp /tmp/unlearn-demo/report.json "$OUT/demo_report.json" 2>/dev/null
grep -h "loaded on\|ERROR\|Traceback" /tmp/unlearn-demo/logs/*.log | head -20 | tee "$OUT/service_logs.txt"
echo "== bench.gpu_pipeline (1, 2, 4 featurizers on cuda; routed, then produced by head)"
timeout 600 python3 -m bench.gpu_pipeline --device cuda --n 6000 --featurizers 1,2,4 --heads 8 --partitions 8 \
    --json "$OUT/gpu_pipeline.json" 2>&1 | grep -v "^%" | tee "$OUT/gpu_pipeline.log"
timeout 600 python3 -m bench.gpu_pipeline --device cuda --n 6000 --featurizers 1,2,4 --heads 8 --partitions 8 \
    --direct --json "$OUT/gpu_pipeline_direct.json" 2>&1 | grep -v "^%" | tee "$OUT/gpu_pipeline_direct.log"
