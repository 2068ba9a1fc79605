#!/usr/bin/env python3
"""What a brick spends on silent connections: starts `rackmem brick`, opens N TCP connections
from N loopback addresses (127.0.x.y: all loopback on Linux, so no per-address cap applies)
that never send a byte, and prints the brick's resident memory and threads before and after.

Usage: scripts/silent-connections.py PATH/TO/rackmem N
"""
import socket, subprocess, sys, time, resource, re
binary, n = sys.argv[1], int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
p = subprocess.Popen([binary, "brick", "--listen", "tcp://127.0.0.1:0", "--size", "1GiB", "--secret", "s3cret",
                      "--max-connections", "4096", "--handshake-timeout-ms", "600000"],
                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
addr = None
while addr is None:
    line = p.stderr.readline()
    m = re.search(r"tcp://([0-9.]+):(\d+)", line)
    if m: addr = (m.group(1), int(m.group(2)))
def rss():
    for l in open(f"/proc/{p.pid}/status"):
        if l.startswith("VmRSS:"): return int(l.split()[1])
time.sleep(0.5)
before = rss()
socks = []
for i in range(n):
    s = socket.socket(); s.bind((f"127.0.{1 + i // 200}.{1 + i % 200}", 0)); s.connect(addr); socks.append(s)
time.sleep(3)
threads = len(__import__("os").listdir(f"/proc/{p.pid}/task"))
after = rss()
print(f"{binary}: {n} silent connections: RSS {before} KiB -> {after} KiB ({(after - before) * 1024 // n} bytes each), {threads} threads")
p.kill()
