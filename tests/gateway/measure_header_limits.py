"""Measured by hand (too long for the suite): ten 100 MB request headers (the gateway's RSS before and
after) and 1,100 slow-header connections (the share of legitimate calls that succeed meanwhile: one
every 0.2 s; then, with each slow connection reopened as soon as it is closed, 3 rounds of 128 calls
at once over kept-alive connections and 128 over fresh ones) against `agent-cache serve` with its
defaults, three simulated workers, and the open-file limit given as SOFT:HARD (default 1024:4096);
--slow-only skips the large headers.

    PYTHONPATH=$PWD python tests/gateway/measure_header_limits.py 1024:1024
"""
import asyncio, socket, subprocess, sys, threading, time, httpx
from agent_cache.sim import SimFleet
from agent_cache.processes import free_port
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
    async def reopened(stop, opened):  # each slow connection reopened at once when the gateway closes it
        async def one():
            while not stop.is_set():
                try: r, w = await asyncio.open_connection("127.0.0.1", port)
                except OSError: await asyncio.sleep(0.05); continue
                opened[0] += 1
                async def trickle():
                    for i in range(len(TRICKLE)): w.write(TRICKLE[i:i + 1]); await asyncio.sleep(1)
                t = asyncio.ensure_future(trickle())
                try: await r.read(65536)
                except OSError: pass
                t.cancel(); w.close()
        ts = [asyncio.ensure_future(one()) for _ in range(1100)]
        while not stop.is_set(): await asyncio.sleep(0.1)
        [t.cancel() for t in ts]; await asyncio.gather(*ts, return_exceptions=True)
    async def rounds(headers):
        failed, took = {}, []
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=128)) as c:
            async def one():
                t0 = time.monotonic()
                try:
                    r = await c.post(url + "/v1/chat/completions", json=BODY, headers=headers)
                    if r.status_code != 200: failed[r.status_code] = failed.get(r.status_code, 0) + 1
                except httpx.HTTPError as e: failed[type(e).__name__] = failed.get(type(e).__name__, 0) + 1
                took.append(time.monotonic() - t0)
            for _ in range(3): await asyncio.gather(*[one() for _ in range(128)]); await asyncio.sleep(1)
        took.sort()
        return f"{384 - sum(failed.values())} of 384 succeeded (failed: {failed or 'none'}), median {took[192]:.1f} s, slowest {took[-1]:.1f} s"
    stop = threading.Event(); opened = [0]
    a = threading.Thread(target=lambda: asyncio.run(reopened(stop, opened))); a.start(); time.sleep(5)
    for name, headers in (("kept-alive", {}), ("fresh", {"connection": "close"})):
        print(f"1,100 slow-header connections reopened at once, 128 calls at once over {name} connections: "
              f"{asyncio.run(rounds(headers))}")
    stop.set(); a.join()
    print(f"({opened[0]} slow connections opened)")
    p.terminate(); p.wait()
