#!/usr/bin/env bash
# Fuzzes the wire-protocol decoders (fuzz/fuzz_targets/decode.rs) for a bounded time.
# Usage: scripts/fuzz-proto.sh [SECONDS]   (default 60)
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/fuzz"

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "fuzz-proto: a nightly toolchain is needed: rustup toolchain install nightly" >&2
    exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz-proto: installing cargo-fuzz"
    cargo +nightly install --locked cargo-fuzz
fi

echo "fuzz-proto: fuzzing the decoders for ${seconds}s (corpus in fuzz/corpus/decode)"
# The fuzz crate has its own target directory so it never disturbs the workspace's builds.
CARGO_TARGET_DIR="$root/fuzz/target" cargo +nightly fuzz run decode -- -max_total_time="$seconds"
