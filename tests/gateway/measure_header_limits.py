"""Measured by hand (too long for the suite): ten 100 MB request headers (the gateway's RSS before and
after) and 1,100 slow-header connections (the share of legitimate calls that succeed meanwhile)
against `agent-cache serve` with its defaults, three simulated workers, and the open-file limit given
as SOFT:HARD (default 1024:4096); --slow-only skips the large headers.

    PYTHONPATH=$PWD python tests/gateway/measure_header_limits.py 1024:1024
"""
import socket, subprocess, sys, threading, time, httpx
from agent_cache.sim import SimFleet
from agent_cache.bench.realfleet import free_port
BODY = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
NOFILE = sys.argv[1] if len(sys.argv) > 1 else "1024:4096"
TRICKLE = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-a: " + b"b" * 100000
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1]) / 1024
with SimFleet(3) as f:
    port = free_port()
    p = subprocess.Popen(["prlimit", f"--nofile={NOFILE}", sys.executable, "-m", "agent_cache.cli", "serve",
                          "--workers", ",".join(f.urls), "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(url + "/health").status_code == 200: break
        except Exception: time.sleep(0.2)
    httpx.post(url + "/v1/chat/completions", json=BODY)
    r0 = rss(p.pid); sent = [0]*10
    def big(i):
        with socket.create_connection(("127.0.0.1", port)) as s:
            try:
                s.sendall(HEAD + b"x-session-id: ")
                for _ in range(100): s.sendall(b"a" * (1 << 20)); sent[i] += 1 << 20
            except OSError: pass
    ts = [threading.Thread(target=big, args=(i,)) for i in range(10 if "--slow-only" not in sys.argv else 0)]
    [t.start() for t in ts]; [t.join() for t in ts]
    print(f"10 x 100 MB headers: RSS {r0:.0f} MB -> {rss(p.pid):.0f} MB; bytes taken per connection before close: max {max(sent)/1e6:.2f} MB")
    stop = threading.Event(); opened = [0]
    def slow():
        socks = []
        while not stop.is_set():
            while len(socks) < 1100 and not stop.is_set():
                try: socks.append([socket.create_connection(("127.0.0.1", port), timeout=1), 0]); opened[0] += 1
                except OSError: break
            for e in list(socks):
                try: e[0].send(TRICKLE[e[1]:e[1] + 1]); e[1] += 1
                except OSError: socks.remove(e); e[0].close()
            stop.wait(1.0)
        for e in socks: e[0].close()
    a = threading.Thread(target=slow); a.start(); time.sleep(5)
    ok = n = 0; t0 = time.time()
    with httpx.Client(timeout=5) as c:
        while time.time() - t0 < 30:
            n += 1
            try: ok += c.post(url + "/v1/chat/completions", json=BODY, headers={"connection": "close"}).status_code == 200
            except httpx.HTTPError: pass
            time.sleep(0.2)
    stop.set(); a.join()
    print(f"1,100 slow-header connections (1 byte/s, reopened when closed; {opened[0]} opened): {ok} of {n} calls succeeded")
    p.terminate(); p.wait()
