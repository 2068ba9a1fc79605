#!/usr/bin/env bash
# Builds the benchmark workloads (every bench/*.c) into OUT_DIR (default bench/bin).
# Usage: bench/build.sh [OUT_DIR]     (`rackmem bench` builds them itself; this is for runs by hand)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/bin}"
mkdir -p "$out"
for src in "$here"/*.c; do
    name="$(basename "$src" .c)"
    echo "[bench/build] gcc $name.c -> $out/$name"
    gcc -O2 -Wall -Wextra -Werror -std=gnu11 -pthread -o "$out/$name" "$src" -lm
done
