#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with what the GPU machine lacks, for `bash scripts/gpu_suite.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
rm -f .whl/flare_l2evict-*.whl
python3 -m pip wheel -q --no-deps -w .whl .
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl \
    b12x==1.5.1 pydantic==2.13.4 pydantic_core==2.46.4 annotated-types typing-inspection
ls -la .whl
