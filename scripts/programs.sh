#!/usr/bin/env bash
# Installs the real programs that the compatibility suite (tests/compat) and `rackmem bench apps`
# run under rackmem: servers, language runtimes, databases and compressors from Debian, and NumPy
# from PyPI. Idempotent: installs only what is missing.
# Usage: ./scripts/programs.sh        (as root; scripts/test calls it)
set -euo pipefail
say() { printf '\033[1m[programs]\033[0m %s\n' "$*"; }

# package → a file it installs (checked instead of dpkg, so a program that is present some other
# way is not reinstalled)
declare -A want=(
  [redis-server]=/usr/bin/redis-server          # linked against libjemalloc.so.2
  [redis-tools]=/usr/bin/redis-benchmark
  [memcached]=/usr/bin/memcached
  [libmemcached-tools]=/usr/bin/memcslap
  [libjemalloc-dev]=/usr/include/jemalloc/jemalloc.h
  [libtcmalloc-minimal4]=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
  [libmimalloc2.0]=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2
  [openjdk-17-jdk-headless]=/usr/lib/jvm/java-17-openjdk-amd64/bin/javac
  [nodejs]=/usr/bin/node
  [sqlite3]=/usr/bin/sqlite3
  [postgresql]=/usr/lib/postgresql/15/bin/postgres
  [zstd]=/usr/bin/zstd
  [xz-utils]=/usr/bin/xz
  [busybox-static]=/bin/busybox
  [sysbench]=/usr/bin/sysbench                  # a held-out workload of rackmem bench workloads
  [etcd-server]=/usr/bin/etcd                   # a Go program: stays local under rackmem
  [etcd-client]=/usr/bin/etcdctl
  [acl]=/usr/bin/setfacl                        # lets user postgres open /dev/userfaultfd in the suite
  [openmpi-bin]=/usr/bin/mpirun                 # the MPI_Put/MPI_Get peer of rackmem bench transfer
  [libopenmpi-dev]=/usr/bin/mpicc
)
missing=()
for pkg in "${!want[@]}"; do
  [ -e "${want[$pkg]}" ] || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    say "error: missing ${missing[*]}; run as root (apt-get install needs it)" >&2
    exit 1
  fi
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! python3 -c 'import numpy' 2>/dev/null; then
  say "installing numpy (PyPI) for $(command -v python3)"
  python3 -m pip install -q numpy
fi
say "ok"
