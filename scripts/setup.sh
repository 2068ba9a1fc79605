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
# ip and tc: `rackmem bench emulate --veth` and its test shape a veth pair between namespaces.
{ command -v ip >/dev/null && command -v tc >/dev/null; } || need_pkgs+=(iproute2)
# nft: the circuits' test configures a switch namespace with nftables (netdev fwd).
command -v nft >/dev/null || need_pkgs+=(nftables)
# A headless browser: the dashboard's test loads /ui/ in it against a real control plane.
command -v chromium >/dev/null || need_pkgs+=(chromium)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  say "installing ${need_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}"
fi

# The control plane's etcd store (cargo feature `etcd`, built and tested by scripts/test):
# etcd-client compiles etcd's gRPC definitions with protoc and the Google .proto files, and the
# tests start Debian's etcd server (package etcd-server; the package `etcd` has no candidate).
etcd_pkgs=()
command -v protoc >/dev/null || etcd_pkgs+=(protobuf-compiler)
[ -e /usr/include/google/protobuf/descriptor.proto ] || etcd_pkgs+=(libprotobuf-dev)
command -v etcd >/dev/null || etcd_pkgs+=(etcd-server)
if [ "${#etcd_pkgs[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    say "installing ${etcd_pkgs[*]} (the etcd store and its tests)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${etcd_pkgs[@]}" >/dev/null
  else
    say "warning: missing ${etcd_pkgs[*]}: run as root (or apt-get install them) to build with --features etcd; without etcd the etcd tests skip"
  fi
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
