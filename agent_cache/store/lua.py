"""Lua scripts of the Redis store.

ROUTE is a port of :func:`agent_cache.placement.rule.choose_worker` plus
the bookkeeping of :meth:`agent_cache.store.memory.MemoryStore.route`; keep
all three in step (a test compares them on random scenarios). Worker and
purged-session keys are built inside the script; they share the deployment's
hash tag with the declared keys, so they live in the same Cluster slot.
"""

# Shared by ROUTE, REPORT and RELEASE: in-flight releases the caller owes
# (agent_cache.store.base.ReleaseBatch). ARGV from ``first``: the source (one
# router), then url, running total, unacknowledged delta triples. The last
# total applied per source and worker is kept, so a batch delivered twice
# (resent after a timeout) is applied once.
_APPLY_RELEASES = r"""
local function apply_releases(tag, first)
  local source = ARGV[first]
  if source == nil then return end
  local key = tag .. ':inflight'
  local rkey = tag .. ':rel:' .. source
  for i = first + 1, #ARGV, 3 do
    local url, total = ARGV[i], tonumber(ARGV[i + 1])
    local count = tonumber(ARGV[i + 2])
    if source ~= '' then
      local last = redis.call('HGET', rkey, url)
      if last then count = total - tonumber(last) end
    end
    if count > 0 then
      -- never below zero, even after a Redis restart lost the increment
      if redis.call('HINCRBY', key, url, -count) < 0 then redis.call('HSET', key, url, 0) end
      if source ~= '' then
        redis.call('HSET', rkey, url, total)
        local lk = tag .. ':lease:' .. source
        if redis.call('HINCRBY', lk, url, -count) < 0 then redis.call('HSET', lk, url, 0) end
      end
    end
  end
  -- a router that released nothing for a day starts over from its deltas (only after
  -- a release: at maxmemory a first write that is not refused would let the script grow memory)
  if source ~= '' and #ARGV > first then
    redis.call('PEXPIRE', rkey, 86400000)
    redis.call('PEXPIRE', tag .. ':lease:' .. source, 86400000)  -- a no-op when it does not exist
  end
end
"""

# In-flight counts are leases: ':lease:<source>' holds what one router has in
# flight per worker, and ':leases' when each router's lease ends unless renewed
# (every route renews it; a router with calls in flight renews it in the
# background). A router that died (a killed client) stops renewing, and the
# next route or renewal by anyone takes its counts out of ':inflight'.
_LEASES = r"""
local function reclaim_leases(tag, now)
  local lz, ikey = tag .. ':leases', tag .. ':inflight'
  for _, src in ipairs(redis.call('ZRANGEBYSCORE', lz, '-inf', '(' .. tostring(now), 'LIMIT', 0, 16)) do
    local lk = tag .. ':lease:' .. src
    local held = redis.call('HGETALL', lk)
    redis.call('DEL', lk)
    redis.call('ZREM', lz, src)
    for i = 1, #held, 2 do
      local c = tonumber(held[i + 1])
      if c > 0 and redis.call('HINCRBY', ikey, held[i], -c) < 0 then redis.call('HSET', ikey, held[i], 0) end
    end
  end
end

local function hold(tag, source, url, now, lease_ms)
  if source == nil or source == '' or lease_ms <= 0 then return end
  local lk = tag .. ':lease:' .. source
  -- its day-long TTL is set as it gains a call, and renewed by every release and RENEW
  if redis.call('HINCRBY', lk, url, 1) == 1 then redis.call('PEXPIRE', lk, 86400000) end
  redis.call('ZADD', tag .. ':leases', tostring(now + lease_ms), source)
end
"""

# A session counts in its worker's footprint (':kv', ':an') while it is used
# within the live window; quiet sessions give their KV tokens back (':act'
# indexes them by last use), and come back into the count on their next call
# or report. Expired sessions are forgotten (':live' indexes them). Both
# passes are a single range read on most decisions.
_FOOTPRINT = r"""
local function detach(tag, url, held, active)
  if active then
    if held ~= 0 then redis.call('HINCRBY', tag .. ':kv', url, -held) end
    redis.call('HINCRBY', tag .. ':an', url, -1)
  end
  redis.call('HINCRBY', tag .. ':w:' .. url, 'sessions', -1)
end

local function activate(tag, sk, member, url, held, active, until_ms)
  if not active then
    if held ~= 0 then redis.call('HINCRBY', tag .. ':kv', url, held) end
    redis.call('HINCRBY', tag .. ':an', url, 1)
    redis.call('HSET', sk, 'active', '1')
  end
  redis.call('ZADD', tag .. ':act', tostring(until_ms), member)
end
"""

# A template's records (':t:', ':ts:', ':ti:', ':tis:') expire ``retention`` ms
# after its last use, so they go with its last session; ':tu' indexes the
# templates in use by last use (stats read the recent ones, the route script
# drops the expired members). Their expiry is pushed back at most once a
# second (retention is at least the session TTL): six commands on every call
# were a sixth of the route script's work. A record a script creates gets its
# TTL from that script (``expire_new``).
_TEMPLATES = r"""
local function touch_template(tag, tmember, now, retention)
  local last = redis.call('ZSCORE', tag .. ':tu', tmember)
  if last and tonumber(now) - tonumber(last) < math.min(1000, retention / 4) then return end
  for _, kind in ipairs({':t:', ':ts:', ':ti:', ':tis:'}) do
    redis.call('PEXPIRE', tag .. kind .. tmember, retention)  -- a no-op for a record not written yet
  end
  local tu = tag .. ':tu'
  redis.call('ZADD', tu, tostring(now), tmember)
  redis.call('PEXPIRE', tu, retention)
end

local function expire_new(key, created, retention)
  if created then redis.call('PEXPIRE', key, retention) end
end
"""

# Usage reports a router queued (they ride on its next store write, so a call
# costs one round trip). ARGV from ``first``: their count, the session key TTL
# and the template retention (ms), then per report the session member, worker,
# epoch, template id, template member, prompt tokens, cached tokens, now (ms).
# Returns the index after them.
_APPLY_REPORTS = r"""
local function apply_report(tag, member, worker, epoch, tid, tmember, p, c, now, skey_ttl, retention)
  local sk = tag .. ':s:' .. member
  local wk = tag .. ':w:' .. worker
  redis.call('HINCRBY', wk, 'prompt_tokens', p)
  redis.call('HINCRBY', wk, 'cached_tokens', c)
  redis.call('HINCRBY', tag .. ':use', 'uncached', math.max(0, p - c))
  redis.call('HINCRBY', tag .. ':use', 'calls', 1)
  local rec = redis.call('HMGET', sk, 'worker', 'epoch', 'last_cached', 'held', 'active', 'quiet')
  if rec[1] == worker and tonumber(rec[2]) == epoch then
    local open = redis.call('HINCRBY', sk, 'open', -1)
    if open < 0 then redis.call('HSET', sk, 'open', 0); open = 0 end
    if open == 0 or rec[5] == '0' then  -- else another call is running: its route's time stands
      -- the call ended: live while its next one may come
      activate(tag, sk, member, worker, tonumber(rec[4] or '0'), rec[5] ~= '0', tonumber(now) + tonumber(rec[6] or '0'))
    end
    redis.call('HINCRBY', sk, 'prompt_tokens', p)
    redis.call('HINCRBY', sk, 'cached_tokens', c)
    redis.call('HSET', sk, 'prev_cached', rec[3], 'last_cached', c, 'last_seen', now, 'held', p)
    local held = tonumber(rec[4] or '0')
    if p ~= held then redis.call('HINCRBY', tag .. ':kv', worker, p - held) end
    redis.call('ZADD', tag .. ':live', now, member)
    redis.call('PEXPIRE', sk, skey_ttl)
  end
  if tid ~= '' then
    local ts, tk = tag .. ':ts:' .. tmember, tag .. ':t:' .. tmember
    local total = redis.call('HINCRBY', ts, 'prompt_tokens', p)
    redis.call('HINCRBY', ts, 'cached_tokens', c)
    local added = redis.call('ZADD', tk, now, worker)
    touch_template(tag, tmember, now, retention)
    expire_new(ts, total == p, retention)  -- (or a template whose first reports were all 0 tokens)
    expire_new(tk, added == 1, retention)
  end
end

local function apply_reports(tag, first)
  local n = tonumber(ARGV[first] or '0')
  if n == 0 then return first + 1 end
  local skey_ttl, retention = tonumber(ARGV[first + 1]), tonumber(ARGV[first + 2])
  for i = 0, n - 1 do
    local j = first + 3 + 8 * i
    apply_report(tag, ARGV[j], ARGV[j + 1], tonumber(ARGV[j + 2]), ARGV[j + 3], ARGV[j + 4],
      tonumber(ARGV[j + 5]), tonumber(ARGV[j + 6]), ARGV[j + 7], skey_ttl, retention)
  end
  return first + 3 + 8 * n
end
"""

# A session key carries a TTL of twice the session TTL, a safety net for a
# deployment that stops routing: the purge below forgets sessions long before.
# If Redis expired one first (no route for that long), its share of the
# per-worker counts cannot be taken back one by one, so they are recounted
# from the sessions that remain (O(live sessions), once after such a pause).
_PURGE = r"""
local function recount(tag)
  local live, act = tag .. ':live', tag .. ':act'
  local sessions, kv, an = {}, {}, {}
  for _, m in ipairs(redis.call('ZRANGE', live, 0, -1)) do
    local rec = redis.call('HMGET', tag .. ':s:' .. m, 'worker', 'held', 'active')
    if rec[1] then
      local url = rec[1]
      sessions[url] = (sessions[url] or 0) + 1
      if rec[3] ~= '0' then
        kv[url] = (kv[url] or 0) + tonumber(rec[2] or '0')
        an[url] = (an[url] or 0) + 1
      end
    else
      redis.call('ZREM', live, m)
      redis.call('ZREM', act, m)
    end
  end
  redis.call('DEL', tag .. ':kv', tag .. ':an')
  for _, url in ipairs(redis.call('SMEMBERS', tag .. ':workers')) do
    redis.call('HSET', tag .. ':w:' .. url, 'sessions', sessions[url] or 0)
  end
  for url, n in pairs(kv) do redis.call('HSET', tag .. ':kv', url, n) end
  for url, n in pairs(an) do redis.call('HSET', tag .. ':an', url, n) end
end

local function purge(tag, idle, cutoff, template_cutoff)
  local act, live = tag .. ':act', tag .. ':live'
  local orphans = false
  -- removals first: at maxmemory Redis refuses a script's first write unless
  -- it frees memory, and lets every later write of a script that has written
  local quiet = redis.call('ZRANGEBYSCORE', act, '-inf', '(' .. tostring(idle), 'LIMIT', 0, 512)
  for _, m in ipairs(quiet) do
    local sk = tag .. ':s:' .. m
    redis.call('ZREM', act, m)
    local rec = redis.call('HMGET', sk, 'worker', 'held', 'active')
    if not rec[1] then orphans = true end
    if rec[1] and rec[3] ~= '0' then
      redis.call('HSET', sk, 'active', '0')
      local held = tonumber(rec[2] or '0')
      if held ~= 0 then redis.call('HINCRBY', tag .. ':kv', rec[1], -held) end
      redis.call('HINCRBY', tag .. ':an', rec[1], -1)
    end
  end
  local stale = redis.call('ZRANGEBYSCORE', live, '-inf', '(' .. tostring(cutoff), 'LIMIT', 0, 512)
  for _, m in ipairs(stale) do
    local sk = tag .. ':s:' .. m
    local rec = redis.call('HMGET', sk, 'worker', 'held', 'active')
    redis.call('DEL', sk)
    redis.call('ZREM', live, m)
    redis.call('ZREM', act, m)
    if rec[1] then detach(tag, rec[1], tonumber(rec[2] or '0'), rec[3] ~= '0') else orphans = true end
  end
  if orphans then recount(tag) end
  -- the expired templates' own keys expire by their TTL; only the index needs trimming
  -- (checked first: a no-op removal would count as this script's first write)
  local tu, below = tag .. ':tu', '(' .. tostring(template_cutoff)
  if #redis.call('ZRANGEBYSCORE', tu, '-inf', below, 'LIMIT', 0, 1) > 0 then
    redis.call('ZREMRANGEBYSCORE', tu, '-inf', below)
  end
end
"""

ROUTE = _APPLY_RELEASES + _FOOTPRINT + _TEMPLATES + _APPLY_REPORTS + _PURGE + _LEASES + r"""
local tag, member, tid, pool, tenant, sid = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local now = tonumber(ARGV[7])
local ttl = tonumber(ARGV[8])
local window = tonumber(ARGV[9])
local live_window = tonumber(ARGV[10])
local quiet_factor = tonumber(ARGV[11])
local min_quiet = tonumber(ARGV[12])
local balance_factor = tonumber(ARGV[13])
local move_factor = tonumber(ARGV[14])
local slack = tonumber(ARGV[15])
local est = tonumber(ARGV[16])
local tmember = ARGV[17]
local skey, tkey = KEYS[1], KEYS[2]
local ikey, kvkey, ankey = tag .. ':inflight', tag .. ':kv', tag .. ':an'
local cutoff = now - ttl

local lease_ms = tonumber(ARGV[19])
local skey_ttl = 2 * ttl
local retention = math.max(ttl, 2 * window)
purge(tag, now, cutoff, now - retention)  -- first: it frees memory even when Redis is at maxmemory
reclaim_leases(tag, now)
local source_at = apply_reports(tag, 20)  -- the router's queued usage, before the pin is read
apply_releases(tag, source_at)

-- placement.quiet_after
local function quiet_after(pause)
  if pause <= 0 then return live_window end
  return math.min(live_window, math.max(min_quiet, math.floor(quiet_factor * pause)))
end

local rec = redis.call('HMGET', skey, 'worker', 'epoch', 'last_cached', 'prev_cached', 'last_seen', 'held', 'steps',
  'active', 'pause')
local pin, held, steps, pause = nil, 0, 0, 0
if rec[1] then
  if tonumber(rec[5]) < cutoff then  -- expired, not yet purged (purge is bounded per call)
    detach(tag, rec[1], tonumber(rec[6] or '0'), rec[8] ~= '0')
    redis.call('DEL', skey)
    redis.call('ZREM', tag .. ':live', member)
    redis.call('ZREM', tag .. ':act', member)
  else
    pin = {worker = rec[1], epoch = tonumber(rec[2]), last = tonumber(rec[3]), prev = tonumber(rec[4])}
    held, steps = tonumber(rec[6] or '0'), tonumber(rec[7] or '0')
    pause = math.max(tonumber(rec[9] or '0'), now - tonumber(rec[5]))  -- the longest wait for its next call
    -- its history is live again before the decision weighs it
    activate(tag, skey, member, rec[1], held, rec[8] ~= '0', now + live_window)
  end
end

-- ARGV[18]: the pool's workers, one "url state capacity" line each
local urls, states, caps = {}, {}, {}
for url, state, cap in string.gmatch(ARGV[18], '(%S+) (%S+) (%S+)\n') do
  local i = #urls + 1
  urls[i], states[i], caps[i] = url, state, tonumber(cap)
end
local n = #urls
local infl, kvs, ans = {}, {}, {}
if n > 0 then
  local inflight = redis.call('HMGET', ikey, unpack(urls))
  local kv = redis.call('HMGET', kvkey, unpack(urls))
  local an = redis.call('HMGET', ankey, unpack(urls))
  for i = 1, n do
    infl[i], kvs[i], ans[i] = tonumber(inflight[i] or '0'), tonumber(kv[i] or '0'), tonumber(an[i] or '0')
  end
end

local holders = {}
if tid ~= '' then
  for _, u in ipairs(redis.call('ZRANGEBYSCORE', tkey, tostring(now - window), '+inf')) do holders[u] = true end
end

local function score(url)
  return tonumber(string.sub(redis.sha1hex(sid .. '\n' .. url), 1, 12), 16)
end

-- placement.mean_session
local function mean_session()
  local total, count = 0.0, 0
  for i = 1, n do total = total + kvs[i]; count = count + ans[i] end
  if count > 0 then return total / count end
  return 0.0
end

-- placement.expected_footprint
local function expected(tokens)
  return math.max(tokens, mean_session())
end

-- placement.projected
local function projected(i, m)
  return math.max(kvs[i], ans[i] * m)
end

-- placement.scale_of
local function scale_of(idx)
  local m = mean_session()
  local total = 0.0
  for _, i in ipairs(idx) do total = total + math.max(caps[i], 1) end
  local mean_cap = total / #idx
  local load = 0.0
  for _, i in ipairs(idx) do load = load + projected(i, m) * (mean_cap / math.max(caps[i], 1)) end
  local use = redis.call('HMGET', tag .. ':use', 'uncached', 'calls')
  local calls = tonumber(use[2] or '0')
  local u = est
  if calls > 0 then u = tonumber(use[1]) / calls end
  return {m = m, mean_cap = mean_cap, fair = balance_factor * (load / #idx), u = u}
end

-- placement.cost
local function cost(i, g, sc)
  local miss = est
  if holders[urls[i]] then miss = 0.0 end
  local cap = math.max(caps[i], 1)
  local held = projected(i, sc.m)
  local pushed = math.max(0.0, held + g - cap) - math.max(0.0, held - cap)
  local excess = math.max(0.0, held * (sc.mean_cap / cap) - sc.fair)
  return miss + pushed + excess + sc.u * infl[i]
end

local function cheapest(idx, g)
  local sc = scale_of(idx)
  local best = idx[1]
  local bc, bs = cost(best, g, sc), score(urls[best])
  for j = 2, #idx do
    local i = idx[j]
    local c, s = cost(i, g, sc), score(urls[i])
    if c < bc or (c == bc and s > bs) then best, bc, bs = i, c, s end
  end
  return best
end

local reason = nil
if pin then
  local cur = nil
  for i = 1, n do if urls[i] == pin.worker then cur = i; break end end
  if not cur then reason = 'removed'
  elseif states[cur] == 'down' then reason = 'unhealthy'
  elseif states[cur] == 'draining' then reason = 'draining'
  elseif pin.last < pin.prev then  -- an intact prefix never moves for balance alone
    if kvs[cur] > caps[cur] then
      for i = 1, n do
        if states[i] == 'up' and urls[i] ~= pin.worker and kvs[i] + held <= caps[i] then reason = 'evicted'; break end
      end
    end
    if not reason then
      local total, cnt = 0.0, 0
      for i = 1, n do if states[i] == 'up' then total = total + infl[i]; cnt = cnt + 1 end end
      if infl[cur] > move_factor * (total / cnt) + slack then reason = 'overloaded' end
    end
  end
end

local chosen, outcome, epoch, previous = nil, nil, 1, ''
if pin and not reason then
  chosen, outcome, epoch = pin.worker, 'pinned', pin.epoch
else
  local cands = {}
  for i = 1, n do
    if states[i] == 'up' and (not pin or urls[i] ~= pin.worker) then
      if reason ~= 'evicted' or kvs[i] + held <= caps[i] then cands[#cands + 1] = i end
    end
  end
  if #cands == 0 then
    if pin then return {'', 'none', pin.epoch, ''} end
    return {'', 'none', 0, ''}
  end
  local g = expected(math.max(est, held))
  local best = cheapest(cands, g)
  chosen = urls[best]
  if holders[chosen] then outcome = 'placed_template' else outcome = 'placed_least_load' end
  if pin then
    outcome, epoch, previous = 'moved:' .. reason, pin.epoch + 1, pin.worker
  end
end

local wk = tag .. ':w:' .. chosen
if not pin then
  redis.call('HSET', skey, 'worker', chosen, 'template', tid, 'pool', pool, 'tenant', tenant,
    'created', tostring(now), 'prompt_tokens', 0, 'cached_tokens', 0, 'last_cached', 0, 'prev_cached', 0,
    'epoch', epoch, 'active', '1')
  redis.call('HINCRBY', wk, 'sessions', 1)
  redis.call('HINCRBY', ankey, chosen, 1)
  redis.call('SADD', tag .. ':workers', chosen)
elseif previous ~= '' then
  -- The new worker re-prefills the whole history, so it holds as much as before.
  detach(tag, previous, held, true)
  redis.call('HSET', skey, 'worker', chosen, 'epoch', epoch, 'last_cached', 0, 'prev_cached', 0)
  redis.call('HINCRBY', wk, 'sessions', 1)
  if held ~= 0 then redis.call('HINCRBY', kvkey, chosen, held) end
  redis.call('HINCRBY', ankey, chosen, 1)
  redis.call('SADD', tag .. ':workers', chosen)
end
if est > held then
  redis.call('HINCRBY', kvkey, chosen, est - held)
  held = est
end
redis.call('HSET', skey, 'last_seen', tostring(now), 'steps', steps + 1, 'held', held, 'pause', pause,
  'quiet', quiet_after(pause))
if outcome == 'pinned' then  -- its calls routed and not reported
  redis.call('HINCRBY', skey, 'open', 1)
else
  redis.call('HSET', skey, 'open', 1)
end
redis.call('PEXPIRE', skey, skey_ttl)
redis.call('ZADD', tag .. ':live', tostring(now), member)
if not pin then redis.call('ZADD', tag .. ':act', tostring(now + live_window), member) end  -- a pin was above
redis.call('HINCRBY', ikey, chosen, 1)
hold(tag, ARGV[source_at], chosen, now, lease_ms)
if tid ~= '' then
  if outcome ~= 'pinned' then  -- what ABANDON restores if this placement's call fails
    redis.call('HSET', skey, 'tprev', redis.call('ZSCORE', tkey, chosen) or '')
  end
  local added = redis.call('ZADD', tkey, tostring(now), chosen)
  touch_template(tag, tmember, now, retention)
  expire_new(tkey, added == 1, retention)
end
redis.call('HINCRBY', tag .. ':outcomes', outcome, 1)
return {chosen, outcome, epoch, previous}
"""

# KEYS: the in-flight hash (declared for Redis Cluster's slot). ARGV: tag, then
# the reports (a count, then 8 fields each: see _APPLY_REPORTS), then the
# release batch. Writes what a router queued since its last store write.
REPORTS = _APPLY_RELEASES + _FOOTPRINT + _TEMPLATES + _APPLY_REPORTS + r"""
apply_releases(ARGV[1], apply_reports(ARGV[1], 2))
return 1
"""

# KEYS: session, template zset. ARGV: tag, member, worker, epoch, then the
# release batch. Port of MemoryStore.abandon: the first call of a placement
# failed, so the pin, its KV estimate and the template mark it set go.
ABANDON = _APPLY_RELEASES + _FOOTPRINT + r"""
local tag, member, worker = ARGV[1], ARGV[2], ARGV[3]
local epoch = tonumber(ARGV[4])
apply_releases(tag, 5)
local rec = redis.call('HMGET', KEYS[1], 'worker', 'epoch', 'held', 'active', 'last_seen', 'tprev')
if rec[1] ~= worker or tonumber(rec[2]) ~= epoch then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', tag .. ':live', member)
redis.call('ZREM', tag .. ':act', member)
detach(tag, worker, tonumber(rec[3] or '0'), rec[4] ~= '0')
local mark = redis.call('ZSCORE', KEYS[2], worker)
if mark and tonumber(mark) == tonumber(rec[5]) then
  if rec[6] and rec[6] ~= '' then
    redis.call('ZADD', KEYS[2], rec[6], worker)
  else
    redis.call('ZREM', KEYS[2], worker)
  end
end
return 1
"""

# KEYS: the in-flight hash. ARGV: tag, now (ms), lease (ms), the router's calls
# in flight per worker ("url count" lines), then its release batch (source
# first). Sets the router's lease to what it really has in flight (a count
# left by a reply that never arrived is corrected here) and renews it.
RENEW = _APPLY_RELEASES + _LEASES + r"""
local tag, now, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
apply_releases(tag, 5)
reclaim_leases(tag, now)
local source, ikey = ARGV[5], KEYS[1]
local lk = tag .. ':lease:' .. source
local truth, total = {}, 0
for url, c in string.gmatch(ARGV[4], '(%S+) (%d+)\n') do truth[url] = tonumber(c); total = total + tonumber(c) end
local held = redis.call('HGETALL', lk)
redis.call('DEL', lk)
for i = 1, #held, 2 do
  local url, c = held[i], tonumber(held[i + 1])
  local diff = (truth[url] or 0) - c
  if diff ~= 0 and redis.call('HINCRBY', ikey, url, diff) < 0 then redis.call('HSET', ikey, url, 0) end
  truth[url] = -(truth[url] or 0) - 1  -- done: the loop below skips it
end
for url, c in pairs(truth) do
  if c > 0 then redis.call('HINCRBY', ikey, url, c) end
end
for url, c in string.gmatch(ARGV[4], '(%S+) (%d+)\n') do
  if tonumber(c) > 0 then redis.call('HSET', lk, url, c) end
end
if total > 0 then
  redis.call('PEXPIRE', lk, 86400000)
  redis.call('ZADD', tag .. ':leases', tostring(now + lease_ms), source)
else
  redis.call('ZREM', tag .. ':leases', source)
end
return 1
"""

# KEYS: the in-flight hash (declared so Redis Cluster sends the script to the
# deployment's slot). ARGV: tag, then the release batch.
RELEASE = _APPLY_RELEASES + r"""
apply_releases(ARGV[1], 2)
return 1
"""
