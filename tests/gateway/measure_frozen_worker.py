"""Measured by hand (too long for the suite): 16 agents (5-step sessions, half streamed) through
`agent-cache serve` over three simulated workers in real time; one worker frozen with SIGSTOP for
FREEZE seconds (default 40); the calls begun during the freeze: how many failed, the slowest, and
those past 6 s.

    PYTHONPATH=$PWD python tests/gateway/measure_frozen_worker.py 40
"""
import signal, sys, threading, time, httpx
from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways, SimWorkers
FREEZE = float(sys.argv[1]) if len(sys.argv) > 1 else 40
SYSTEM = "You are a careful agent. " * 20
with Processes() as procs:
    workers = SimWorkers(procs, 3, time_scale=1.0, capacity_tokens=200_000)
    gw = AgentCacheGateways(procs, workers.urls).urls[0]
    stop = threading.Event(); lock = threading.Lock(); log = []
    def agent(a):
        n = 0
        while not stop.is_set():
            sid = f"a{a}-{n}"; n += 1
            msgs = [{"role": "system", "content": SYSTEM}]
            for step in range(5):
                msgs.append({"role": "user", "content": f"step {step} of {sid}"})
                t0 = time.monotonic(); stream = a % 2 == 0
                try:
                    body = {"model": "m", "messages": msgs, "max_tokens": 16, "stream": stream}
                    if stream:
                        with httpx.stream("POST", gw + "/v1/chat/completions", json=body, headers={"x-session-id": sid}, timeout=120) as r:
                            text = "".join(r.iter_lines()); st = r.status_code; w = r.headers.get("x-agent-cache-worker")
                    else:
                        r = httpx.post(gw + "/v1/chat/completions", json=body, headers={"x-session-id": sid}, timeout=120)
                        st = r.status_code; w = r.headers.get("x-agent-cache-worker")
                except Exception as exc:
                    st, w = repr(exc)[:40], None
                with lock: log.append((t0, time.monotonic() - t0, step, st, w))
                msgs.append({"role": "assistant", "content": "ok"})
    ts = [threading.Thread(target=agent, args=(a,)) for a in range(16)]
    [t.start() for t in ts]
    time.sleep(8)
    victim = workers._procs[0].popen; vurl = workers.urls[0]
    f0 = time.monotonic(); victim.send_signal(signal.SIGSTOP)
    try:
        time.sleep(FREEZE)
    finally:
        victim.send_signal(signal.SIGCONT)
    f1 = time.monotonic()
    time.sleep(5); stop.set(); [t.join() for t in ts]
    during = [e for e in log if f0 <= e[0] < f1]
    first = [e for e in during if e[2] == 0]
    print("calls during freeze", len(during), "failed", sum(e[3] != 200 for e in during))
    print("first steps during freeze: n", len(first), "max s %.1f" % max(e[1] for e in first), "over 6 s:", sum(e[1] > 6 for e in first))
    print("all calls during freeze: max s %.1f" % max(e[1] for e in during), "over 6 s:", sum(e[1] > 6 for e in during))
    late = sorted(e for e in during if e[1] > 6)
    for e in late[:12]: print("  at %.1f took %.1f step %d status %s" % (e[0]-f0, e[1], e[2], e[3]))
    print("served by frozen worker during freeze (placed):", sum(e[4] == vurl for e in during))
