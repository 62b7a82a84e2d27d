"""Lua scripts of the Redis store.

ROUTE is a port of :func:`agent_cache.routing.placement.choose_worker` plus
the bookkeeping of :meth:`agent_cache.store.memory.MemoryStore.route`; keep
all three in step (a test compares them on random scenarios). Worker and
purged-session keys are built inside the script; they share the deployment's
hash tag with the declared keys, so they live in the same Cluster slot.
"""

ROUTE = r"""
local tag, member, tid, pool, tenant, sid = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local now = tonumber(ARGV[7])
local ttl = tonumber(ARGV[8])
local window = tonumber(ARGV[9])
local eps = tonumber(ARGV[10])
local slack = tonumber(ARGV[11])
local move_factor = tonumber(ARGV[12])
local kv_weight = tonumber(ARGV[13])
local est = tonumber(ARGV[14])
local tmember = ARGV[15]
local n = tonumber(ARGV[16])
local skey, tkey = KEYS[1], KEYS[2]
local cutoff = now - ttl

local function wkey(kind, url) return tag .. ':' .. kind .. ':' .. url end

-- Expired sessions give back the KV tokens they were counted for.
local function purge(url)
  local ws = wkey('ws', url)
  local stale = redis.call('ZRANGEBYSCORE', ws, '-inf', '(' .. tostring(cutoff))
  if #stale == 0 then return end
  local wh = wkey('wh', url)
  local freed = 0
  for _, m in ipairs(stale) do
    freed = freed + tonumber(redis.call('HGET', wh, m) or '0')
    redis.call('HDEL', wh, m)
    redis.call('ZREM', ws, m)
    local sk = tag .. ':s:' .. m
    local seen = redis.call('HGET', sk, 'last_seen')
    if seen and tonumber(seen) < cutoff then redis.call('DEL', sk) end
  end
  if freed ~= 0 then redis.call('HINCRBY', wkey('w', url), 'kv_tokens', -freed) end
end

local function detach(url)
  redis.call('ZREM', wkey('ws', url), member)
  local wh = wkey('wh', url)
  local held = tonumber(redis.call('HGET', wh, member) or '0')
  redis.call('HDEL', wh, member)
  if held ~= 0 then redis.call('HINCRBY', wkey('w', url), 'kv_tokens', -held) end
  return held
end

local urls, states, loads = {}, {}, {}
for i = 1, n do
  local base = 16 + 3 * (i - 1)
  urls[i] = ARGV[base + 1]
  states[i] = ARGV[base + 2]
  local cap = tonumber(ARGV[base + 3])
  purge(urls[i])
  local h = redis.call('HMGET', wkey('w', urls[i]), 'inflight', 'kv_tokens')
  local inflight = tonumber(h[1] or '0')
  local kv = tonumber(h[2] or '0')
  loads[i] = inflight + kv_weight * kv / math.max(cap, 1)
end

local rec = redis.call('HMGET', skey, 'worker', 'epoch', 'last_cached', 'prev_cached', 'last_seen')
local pin = nil
if rec[1] then
  if tonumber(rec[5]) < cutoff then
    detach(rec[1])
    redis.call('DEL', skey)
  else
    pin = {worker = rec[1], epoch = tonumber(rec[2]), last = tonumber(rec[3]), prev = tonumber(rec[4])}
  end
end

local holders = {}
if tid ~= '' then
  for _, u in ipairs(redis.call('ZRANGEBYSCORE', tkey, tostring(now - window), '+inf')) do holders[u] = true end
end

local function score(url)
  return tonumber(string.sub(redis.sha1hex(sid .. '\n' .. url), 1, 12), 16)
end

local function least(idx)
  local best = idx[1]
  local bl, bs = loads[best], score(urls[best])
  for j = 2, #idx do
    local i = idx[j]
    local l, s = loads[i], score(urls[i])
    if l < bl or (l == bl and s > bs) then best, bl, bs = i, l, s end
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
  else
    local total, cnt = 0.0, 0
    for i = 1, n do if states[i] == 'up' then total = total + loads[i]; cnt = cnt + 1 end end
    local mean = 0.0
    if cnt > 0 then mean = total / cnt end
    if loads[cur] > move_factor * mean + slack and pin.last < pin.prev then reason = 'overloaded' end
  end
end

local chosen, outcome, epoch, previous = nil, nil, 1, ''
if pin and not reason then
  chosen, outcome, epoch = pin.worker, 'pinned', pin.epoch
else
  local cands = {}
  for i = 1, n do
    if states[i] == 'up' and (not pin or urls[i] ~= pin.worker) then cands[#cands + 1] = i end
  end
  if #cands == 0 then
    if pin then return {'', 'none', pin.epoch, ''} end
    return {'', 'none', 0, ''}
  end
  local total = 0.0
  for _, i in ipairs(cands) do total = total + loads[i] end
  local mean = total / #cands
  local bound = (1.0 + eps) * mean + slack
  local hold = {}
  for _, i in ipairs(cands) do
    if holders[urls[i]] and loads[i] <= bound then hold[#hold + 1] = i end
  end
  if #hold > 0 then
    chosen, outcome = urls[least(hold)], 'placed_template'
  else
    chosen, outcome = urls[least(cands)], 'placed_least_load'
  end
  if pin then
    outcome, epoch, previous = 'moved:' .. reason, pin.epoch + 1, pin.worker
  end
end

local wk, wh = wkey('w', chosen), wkey('wh', chosen)
if not pin then
  redis.call('HSET', skey, 'worker', chosen, 'template', tid, 'pool', pool, 'tenant', tenant,
    'created', tostring(now), 'last_seen', tostring(now), 'steps', 0, 'prompt_tokens', 0,
    'cached_tokens', 0, 'last_cached', 0, 'prev_cached', 0, 'epoch', epoch)
elseif previous ~= '' then
  local held = detach(previous)
  redis.call('HSET', skey, 'worker', chosen, 'epoch', epoch, 'last_cached', 0, 'prev_cached', 0)
  redis.call('HSET', wh, member, held)
  if held ~= 0 then redis.call('HINCRBY', wk, 'kv_tokens', held) end
end
local held = tonumber(redis.call('HGET', wh, member) or '0')
if est > held then
  redis.call('HINCRBY', wk, 'kv_tokens', est - held)
  redis.call('HSET', wh, member, est)
end
redis.call('HSET', skey, 'last_seen', tostring(now))
redis.call('HINCRBY', skey, 'steps', 1)
redis.call('PEXPIRE', skey, 2 * ttl)
redis.call('ZADD', wkey('ws', chosen), tostring(now), member)
redis.call('HINCRBY', wk, 'inflight', 1)
redis.call('SADD', tag .. ':workers', chosen)
if tid ~= '' then
  redis.call('ZADD', tkey, tostring(now), chosen)
  redis.call('PEXPIRE', tkey, 2 * window)
  redis.call('SADD', tag .. ':templates', tmember)
end
redis.call('HINCRBY', tag .. ':outcomes', outcome, 1)
return {chosen, outcome, epoch, previous}
"""

# KEYS: session, template zset, template stats. ARGV: tag, member, worker, epoch,
# template id, template member, prompt tokens, cached tokens, now (ms).
REPORT = r"""
local tag, member, worker = ARGV[1], ARGV[2], ARGV[3]
local epoch = tonumber(ARGV[4])
local tid, tmember = ARGV[5], ARGV[6]
local p, c, now = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
local wk = tag .. ':w:' .. worker
redis.call('HINCRBY', wk, 'prompt_tokens', p)
redis.call('HINCRBY', wk, 'cached_tokens', c)
local rec = redis.call('HMGET', KEYS[1], 'worker', 'epoch', 'last_cached')
if rec[1] == worker and tonumber(rec[2]) == epoch then
  redis.call('HINCRBY', KEYS[1], 'prompt_tokens', p)
  redis.call('HINCRBY', KEYS[1], 'cached_tokens', c)
  redis.call('HSET', KEYS[1], 'prev_cached', rec[3], 'last_cached', c, 'last_seen', now)
  local wh = tag .. ':wh:' .. worker
  local held = tonumber(redis.call('HGET', wh, member) or '0')
  if p ~= held then redis.call('HINCRBY', wk, 'kv_tokens', p - held) end
  redis.call('HSET', wh, member, p)
  redis.call('ZADD', tag .. ':ws:' .. worker, now, member)
end
if tid ~= '' then
  redis.call('HINCRBY', KEYS[3], 'prompt_tokens', p)
  redis.call('HINCRBY', KEYS[3], 'cached_tokens', c)
  redis.call('ZADD', KEYS[2], now, worker)
  redis.call('SADD', tag .. ':templates', tmember)
end
return 1
"""

# KEYS: worker hash. Never below zero, even after a Redis restart lost the increment.
RELEASE = r"""
local v = redis.call('HINCRBY', KEYS[1], 'inflight', -1)
if v < 0 then redis.call('HSET', KEYS[1], 'inflight', 0) end
return v
"""
