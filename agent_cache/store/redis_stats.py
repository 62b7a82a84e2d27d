"""What the Redis store reads back: a session record, and the picture ``stats`` returns
(workers, live sessions, templates in use, outcomes), read in few round trips."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from agent_cache.store import keys
from agent_cache.store.base import STATS_TEMPLATES, to_ms

_INT_FIELDS = (
    "created", "last_seen", "steps", "prompt_tokens", "cached_tokens", "last_cached", "prev_cached", "epoch",
    "held", "active", "pause", "quiet", "open",
)  # fmt: skip



def decode_record(raw: dict[Any, Any]) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    for k, v in raw.items():
        key = k.decode() if isinstance(k, bytes) else k
        val = v.decode() if isinstance(v, bytes) else v
        if key == "tprev":  # the template mark a placement replaced ('': none)
            rec[key] = int(float(val)) if val else None
        else:
            rec[key] = int(float(val)) if key in _INT_FIELDS else val
    return rec


def collect_stats(prefix: str, template_window: float, client: Any, now: float, with_templates: bool) -> dict[str, Any]:
    p = prefix
    now_ms = to_ms(now)
    window = now_ms - to_ms(template_window)
    workers = sorted(m.decode() for m in client.smembers(keys.workers_set(p)))
    # the templates used within the window: O(live), not every template ever seen
    templates, in_window = [], 0
    if with_templates:
        used = keys.templates_in_use(p)
        in_window = int(client.zcount(used, window, "+inf"))
        templates = sorted(m.decode() for m in client.zrevrangebyscore(used, "+inf", window, start=0,
                                                                       num=STATS_TEMPLATES))
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.inflight(p))
    pipe.hgetall(keys.kv_tokens(p))
    pipe.hgetall(keys.live_sessions(p))
    for url in workers:
        pipe.hgetall(keys.worker(p, url))
    for tm in templates:
        tenant_enc, _, tid = tm.partition(":")
        tenant = unquote(tenant_enc)
        pipe.zrangebyscore(keys.template(p, tenant, tid), window, "+inf")
        pipe.hgetall(keys.template_stats(p, tenant, tid))
    pipe.hgetall(keys.outcomes(p))
    pipe.hmget(keys.usage(p), "uncached", "calls")
    inflight, kv, live_sessions, *res, usage = pipe.execute()
    # counts of routers whose lease ended (killed clients): the next route reclaims them; not counted here
    for source in client.zrangebyscore(keys.leases(p), "-inf", f"({now_ms}"):
        for url, count in client.hgetall(keys.lease(p, source.decode())).items():
            inflight[url] = max(0, int(inflight.get(url, 0)) - int(count))
    out_workers: dict[str, Any] = {}
    for i, url in enumerate(workers):
        h = {k.decode(): v.decode() for k, v in res[i].items()}
        key = url.encode()
        out_workers[url] = {
            "state": h.get("state", "up"), "capacity": int(h.get("capacity", 0)),
            "sessions": int(h.get("sessions", 0)), "inflight": int(inflight.get(key, 0)),
            "kv_tokens": int(kv.get(key, 0)), "live_sessions": int(live_sessions.get(key, 0)),
            "prompt_tokens": int(h.get("prompt_tokens", 0)),
            "cached_tokens": int(h.get("cached_tokens", 0)),
        }  # fmt: skip
    base = len(workers)
    out_templates: dict[str, Any] = {}
    for j, tm in enumerate(templates):
        tenant_enc, _, tid = tm.partition(":")
        if not tid:
            continue
        st = {k.decode(): int(v) for k, v in res[base + 2 * j + 1].items()}
        out_templates[f"{unquote(tenant_enc)}/{tid}"] = {
            "workers": sorted(w.decode() for w in res[base + 2 * j]),
            "prompt_tokens": st.get("prompt_tokens", 0),
            "cached_tokens": st.get("cached_tokens", 0),
        }
    outcomes = {k.decode(): int(v) for k, v in res[-1].items()}
    uncached, calls = (int(x or 0) for x in usage)
    return {
        "workers": out_workers,
        "templates": out_templates,
        "templates_in_window": in_window,
        "sessions": sum(w["sessions"] for w in out_workers.values()),
        "outcomes": outcomes,
        "uncached_per_call": uncached / calls if calls > 0 else None,
    }
