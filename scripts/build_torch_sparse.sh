#!/usr/bin/env bash
# Build torch-sparse (PyG's CPU neighbour sampler, when pyg-lib has no wheel for this
# platform) and torch-scatter (which torch-sparse imports) from their PyPI sources against the
# installed torch, into a folder of their own, so that `scripts/sampler_throughput.py --pyg`
# can time PyG's own NeighborLoader:
#
#   bash scripts/build_torch_sparse.sh [TARGET]      # default TARGET: ./.pyg-sampler
#   PYTHONPATH=.pyg-sampler python scripts/sampler_throughput.py --device cpu --pyg
#
# SDIST_DIR=folder: build from the two source archives found there instead of downloading
# them (a machine without network, e.g. the lent GPU hosts: `scripts/gpu-pyg-sampler`).
# The build is CPU-only (FORCE_ONLY_CPU=1): PyG's NeighborLoader samples on the CPU.
#
# Kept out of the test environment on purpose: with torch-sparse importable PyG takes other
# code paths in the layers the tests compare against.  About 25 minutes on two cores.
set -euo pipefail
target=${1:-.pyg-sampler}
tmp=$(mktemp -d)
if [ -n "${SDIST_DIR:-}" ]; then
  cp "$SDIST_DIR"/torch_scatter-2.1.2.tar.gz "$SDIST_DIR"/torch_sparse-0.6.18.tar.gz "$tmp"/
else
  for pkg in torch-scatter==2.1.2 torch-sparse==0.6.18; do
    python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation "$pkg" -d "$tmp"
  done
fi
for src in "$tmp"/torch_scatter-*.tar.gz "$tmp"/torch_sparse-*.tar.gz; do
  FORCE_ONLY_CPU=1 MAX_JOBS=${MAX_JOBS:-2} python3 -m pip wheel -q --no-build-isolation \
    --no-deps --no-index "$src" -w "$tmp/wheel"
done
python3 -m pip install -q --no-deps --target "$target" "$tmp"/wheel/*.whl
python3 -c "import sys; sys.path.insert(0, '$target'); import torch_sparse; print('torch_sparse', torch_sparse.__version__, 'in $target')"
