#!/bin/sh
# Type-check the product with mypy. The import namespace ``unlearn`` is mapped onto the top-level
# folders by the package's editable install, an import hook mypy cannot follow; so mypy reads the
# same files through a tree of symlinks, .typecheck/unlearn/<folder> -> <folder>.
set -eu
PY="${1:-python3}"
cd "$(dirname "$0")/.."
rm -rf .typecheck && mkdir -p .typecheck/unlearn
for pkg in ledger schemas infra features runtime common streams services; do
  ln -s "../../$pkg" ".typecheck/unlearn/$pkg"
done
exec "$PY" -m mypy --config-file pyproject.toml .typecheck/unlearn
