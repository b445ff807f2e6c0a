#!/usr/bin/env bash
# `make up`: after `make setup`, show Stockade running code on both tiers.
set -euo pipefail
cd "$(dirname "$0")/.."
for driver in gvisor runc; do
	printf '%-7s pandas ' "$driver"
	bin/stockade run --driver "$driver" --runtime python -c 'import pandas; print(pandas.__version__)'
done
