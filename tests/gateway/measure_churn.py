"""Measured by hand (too long for the suite): N add/delete cycles through `agent-cache serve`'s admin API
(one simulated worker serving; each cycle a ``POST /workers`` of a fresh URL at a port that refuses
connections, then its ``DELETE``), calls served every 50 cycles; the gateway's RSS and the count of
``agent_cache_`` series on its metrics port (all of them, and those labelled by worker) read after a
warm-up and again once every removed worker is gone; then 10 new-session calls. ``--redis URL`` shares
the fleet board through that Redis (under a fresh ``--prefix``, whose keys are deleted at the end) and
waits past the removed entries' retention on the board.

    PYTHONPATH=$PWD python tests/gateway/measure_churn.py 500 [--redis redis://127.0.0.1:6379/11]
"""
import sys, time, uuid
from urllib.parse import quote
import httpx
from agent_cache.processes import Processes, free_port
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.routing.fleet import GONE_RETENTION
from agent_cache.sim import SimFleet
from agent_cache.store import keys

N = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 500
REDIS = sys.argv[sys.argv.index("--redis") + 1] if "--redis" in sys.argv else None
PREFIX = f"m-{uuid.uuid4().hex[:8]}"
STORE = ["--redis", REDIS, "--prefix", PREFIX] if REDIS else []


def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1]) // 1024


def series(metrics_url):
    """The ``agent_cache_`` samples on the metrics port, without their values."""
    return {l.rsplit(" ", 1)[0] for l in httpx.get(metrics_url, timeout=10).text.splitlines()
            if l.startswith("agent_cache_")}


def counts(samples):
    return len(samples), sum('worker="' in s for s in samples)


def calls(url, tag, n):
    return sum(httpx.post(url + "/v1/chat/completions", headers={"x-session-id": f"{tag}-{i}"}, timeout=60, json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).status_code == 200
        for i in range(n))


def total_workers(url):
    return httpx.get(url + "/workers", timeout=10).json()["total"]


def wait_until(what, condition, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(1)


try:
    with SimFleet(1) as fleet, Processes() as procs:
        mport = free_port()
        gw = AgentCacheGateways(procs, fleet.urls, args=["--admin-loopback", "--metrics-port", str(mport), *STORE])
        url, pid, metrics = gw.urls[0], gw.procs[0].pid, f"http://127.0.0.1:{mport}/metrics"
        # warm-up: one add/delete cycle and calls served, so the baseline is a working gateway's
        warm = f"http://127.0.0.1:{free_port()}"
        assert httpx.post(url + "/workers", json={"url": warm}, timeout=60).status_code == 202
        assert httpx.delete(url + "/workers/" + quote(warm, safe=""), timeout=60).status_code == 202
        served = calls(url, "warm", 20)
        wait_until("the warm-up worker to go", lambda: total_workers(url) == 1, 300)
        time.sleep(3)
        rss0, before = rss(pid), series(metrics)
        all0, per0 = counts(before)
        print(f"baseline (after {served}/20 warm-up calls): RSS {rss0} MB, {all0} agent_cache_ series, "
              f"{per0} with a worker label")
        t_all, served, offered, peak = time.perf_counter(), 0, 0, 0
        for i in range(N):
            w = f"http://127.0.0.1:{free_port()}"  # a fresh port each cycle; nothing listens there
            assert httpx.post(url + "/workers", json={"url": w}, timeout=60).status_code == 202
            assert httpx.delete(url + "/workers/" + quote(w, safe=""), timeout=60).status_code == 202
            if (i + 1) % 50 == 0:
                served, offered = served + calls(url, f"c{i}", 5), offered + 5
                peak = max(peak, rss(pid))
                print(f"{i + 1} cycles: RSS {rss(pid)} MB, {total_workers(url)} workers listed, "
                      f"{time.perf_counter() - t_all:.0f} s")
        print(f"{N} cycles in {time.perf_counter() - t_all:.1f} s; calls served meanwhile {served} of {offered}")
        wait_until("the removed workers to go", lambda: total_workers(url) == 1, 600)
        if REDIS:
            time.sleep(max(GONE_RETENTION, 10 * 2.0) + 10)  # past the gone entries' retention, a refresh or two
        else:
            time.sleep(5)
        rss1, after = rss(pid), series(metrics)
        all1, per1 = counts(after)
        print(f"after: RSS {rss1} MB (peak during the cycles {max(peak, rss1)} MB), {all1} agent_cache_ series, "
              f"{per1} with a worker label")
        print(f"ratio after/before: RSS {rss1 / rss0:.3f}, series {all1 / all0:.3f}, "
              f"worker series {per1 / max(per0, 1):.3f}")
        for s in sorted(after - before):
            print("  new series:", s)
        if REDIS:
            import redis
            r = redis.Redis.from_url(REDIS)
            print(f"fleet board entries left: {r.hlen(keys.tag(PREFIX) + ':fleet')}")
        print(f"new-session calls served: {calls(url, 'after', 10)} of 10")
finally:  # once the gateway has stopped (it writes its last releases at exit)
    if REDIS:
        import redis
        r = redis.Redis.from_url(REDIS)
        stale = list(r.scan_iter(match=keys.tag(PREFIX) + "*", count=1000))
        if stale:
            r.delete(*stale)
