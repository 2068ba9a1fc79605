#!/usr/bin/env bash
# Installs what rackmem needs to build and test on a fresh Debian machine. Idempotent.
set -euo pipefail
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  say "warning: not root; userfaultfd needs root (or CAP_SYS_PTRACE, or vm.unprivileged_userfaultfd=1) and apt-get needs root"
fi

need_pkgs=()
command -v gcc >/dev/null || need_pkgs+=(gcc libc6-dev)
command -v make >/dev/null || need_pkgs+=(make)
command -v python3 >/dev/null || need_pkgs+=(python3)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  say "installing ${need_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}"
fi

if ! command -v cargo >/dev/null; then
  say "error: cargo not found; install Rust (stable) with rustup first" >&2
  exit 1
fi
for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    say "adding rustup component $c"
    rustup component add "$c"
  fi
done

if [ -r /proc/sys/vm/unprivileged_userfaultfd ] && [ "$(id -u)" -ne 0 ] && [ "$(cat /proc/sys/vm/unprivileged_userfaultfd)" = 0 ]; then
  say "note: vm.unprivileged_userfaultfd=0 and you are not root: rackmem run will say what it needs"
fi
say "ok"
