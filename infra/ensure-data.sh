#!/bin/sh
# Make the offline datasets available. Fashion-MNIST is Debian's `dataset-fashion-mnist`
# (30 MB, MIT). Without root or apt we say so; the code then falls back to sklearn's digits where
# it can, and says that too.
dir=/usr/share/datasets/fashion-mnist
[ -f "$dir/train-images-idx3-ubyte.gz" ] && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "installing Debian package dataset-fashion-mnist (offline Fashion-MNIST)..."
  apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1; } || \
    echo "warning: could not install dataset-fashion-mnist; Fashion-MNIST steps will use sklearn digits" >&2
else
  echo "note: Fashion-MNIST missing; run 'sudo apt-get install dataset-fashion-mnist' (falling back to sklearn digits)" >&2
fi
exit 0
