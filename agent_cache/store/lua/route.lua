-- KEYS: the deployment's (store/keys.py), then session, template zset. ARGV: see RedisStore's
-- route arguments (tag, member, template id, pool, tenant, session id, now, TTLs, the policy, the
-- estimate, the workers, the lease, then the queued reports and the release batch). A port of
-- agent_cache.placement.rule.choose_worker plus the bookkeeping of MemoryStore.route: keep the three
-- in step (a test compares them on random scenarios). Worker and purged-session keys are named as
-- the script runs (store/keys.py's families); they share the deployment's hash tag with the
-- declared keys, so they live in the same Cluster slot.
-- needs: releases footprint templates reports_apply purge leases
local member, tid, pool, tenant, sid = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
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
local skey, tkey = KEYS[OWN], KEYS[OWN + 1]
local ikey, kvkey, ankey = K.inflight, K.kv_tokens, K.live_sessions
local cutoff = now - ttl

local lease_ms = tonumber(ARGV[19])
local skey_ttl = 2 * ttl
local retention = math.max(ttl, 2 * window)
purge(now, cutoff, now - retention)  -- first: it frees memory even when Redis is at maxmemory
reclaim_leases(now)
local source_at = apply_reports(20)  -- the router's queued usage, before the pin is read
apply_releases(source_at)

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
    detach(rec[1], tonumber(rec[6] or '0'), rec[8] ~= '0')
    redis.call('DEL', skey)
    redis.call('ZREM', K.live, member)
    redis.call('ZREM', K.active, member)
  else
    pin = {worker = rec[1], epoch = tonumber(rec[2]), last = tonumber(rec[3]), prev = tonumber(rec[4])}
    held, steps = tonumber(rec[6] or '0'), tonumber(rec[7] or '0')
    pause = math.max(tonumber(rec[9] or '0'), now - tonumber(rec[5]))  -- the longest wait for its next call
    -- its history is live again before the decision weighs it
    activate(skey, member, rec[1], held, rec[8] ~= '0', now + live_window)
  end
end

-- ARGV[18]: the pool's workers, one "url state capacity[ held|lacks][ prefix=held|gone]" line each (the
-- marks of the worker's KV events: the template there, the session's latest prefix there; absent without events)
local urls, states, caps, kvt, pfx = {}, {}, {}, {}, {}
for url, state, cap, marks in string.gmatch(ARGV[18], '(%S+) (%S+) (%S+)([^\n]*)\n') do
  local i = #urls + 1
  urls[i], states[i], caps[i], kvt[i], pfx[i] = url, state, tonumber(cap), '', ''
  for m in string.gmatch(marks, '%S+') do
    if string.sub(m, 1, 7) == 'prefix=' then pfx[i] = string.sub(m, 8) else kvt[i] = m end
  end
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
  for i = 1, n do
    if kvt[i] == 'held' then holders[urls[i]] = true elseif kvt[i] == 'lacks' then holders[urls[i]] = nil end
  end
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
  local use = redis.call('HMGET', K.usage, 'uncached', 'calls')
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
  -- an intact prefix never moves for balance alone (placement._move_reason)
  elseif pfx[cur] == 'gone' or (pin.last < pin.prev and pfx[cur] ~= 'held') then
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

local wk = worker_key(chosen)
if not pin then
  redis.call('HSET', skey, 'worker', chosen, 'template', tid, 'pool', pool, 'tenant', tenant,
    'created', tostring(now), 'prompt_tokens', 0, 'cached_tokens', 0, 'last_cached', 0, 'prev_cached', 0,
    'epoch', epoch, 'active', '1')
  redis.call('HINCRBY', wk, 'sessions', 1)
  redis.call('HINCRBY', ankey, chosen, 1)
  redis.call('SADD', K.workers_set, chosen)
elseif previous ~= '' then
  -- The new worker re-prefills the whole history, so it holds as much as before.
  detach(previous, held, true)
  redis.call('HSET', skey, 'worker', chosen, 'epoch', epoch, 'last_cached', 0, 'prev_cached', 0)
  redis.call('HINCRBY', wk, 'sessions', 1)
  if held ~= 0 then redis.call('HINCRBY', kvkey, chosen, held) end
  redis.call('HINCRBY', ankey, chosen, 1)
  redis.call('SADD', K.workers_set, chosen)
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
redis.call('ZADD', K.live, tostring(now), member)
if not pin then redis.call('ZADD', K.active, tostring(now + live_window), member) end  -- a pin was above
redis.call('HINCRBY', ikey, chosen, 1)
hold(ARGV[source_at], chosen, now, lease_ms)
if tid ~= '' then
  if outcome ~= 'pinned' then  -- what ABANDON restores if this placement's call fails
    redis.call('HSET', skey, 'tprev', redis.call('ZSCORE', tkey, chosen) or '')
  end
  local added = redis.call('ZADD', tkey, tostring(now), chosen)
  touch_template(tmember, now, retention)
  expire_new(tkey, added == 1, retention)
end
redis.call('HINCRBY', K.outcomes, outcome, 1)
return {chosen, outcome, epoch, previous}
