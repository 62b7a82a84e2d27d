"""Measured by hand (too long for the suite): N workers added one ``POST /workers`` after another to
`agent-cache serve` (one simulated worker; each added worker at a port that refuses connections, as a
pod still loading its model), each POST timed and the gateway's RSS read; then 10 new-session calls.
``--redis URL`` shares the fleet board through that Redis.

    PYTHONPATH=$PWD python tests/gateway/measure_admin_cost.py 1000 [--redis redis://127.0.0.1:6379/0]
"""
import sys, time, uuid, httpx
from agent_cache.processes import Processes, free_port
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.sim import SimFleet
N = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 1000
STORE = ["--redis", sys.argv[sys.argv.index("--redis") + 1], "--prefix", f"m-{uuid.uuid4().hex[:8]}"] \
    if "--redis" in sys.argv else []
def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1]) // 1024
with SimFleet(1) as fleet, Processes() as procs:
    gw = AgentCacheGateways(procs, fleet.urls, args=["--admin-loopback", *STORE])
    url, pid = gw.urls[0], gw.procs[0].pid
    print(f"RSS at start {rss(pid)} MB")
    ports, times, t_all = [free_port() for _ in range(N)], [], time.perf_counter()
    for i, port in enumerate(ports):
        t0 = time.perf_counter()
        assert httpx.post(url + "/workers", json={"url": f"http://127.0.0.1:{port}"}, timeout=60).status_code == 202
        times.append(time.perf_counter() - t0)
        if i + 1 in (10, 100, 200, 500, 1000, N):
            print(f"{i + 1} workers: slowest of the last 10 POSTs {max(times[-10:]) * 1000:.0f} ms, RSS {rss(pid)} MB")
    print(f"{N} POSTs in {time.perf_counter() - t_all:.1f} s")
    time.sleep(12)
    print(f"RSS 12 s later {rss(pid)} MB")
    ok = sum(httpx.post(url + "/v1/chat/completions", headers={"x-session-id": f"s{i}"}, timeout=60, json={
        "model": "m", "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 4}).status_code == 200
        for i in range(10))
    print(f"new-session calls served: {ok} of 10")
