-- A session key carries a TTL of twice the session TTL, a safety net for a
-- deployment that stops routing: the purge below forgets sessions long before.
-- If Redis expired one first (no route for that long), its share of the
-- per-worker counts cannot be taken back one by one, so they are recounted
-- from the sessions that remain (O(live sessions), once after such a pause).
local function recount()
  local live, act = K.live, K.active
  local sessions, kv, an = {}, {}, {}
  for _, m in ipairs(redis.call('ZRANGE', live, 0, -1)) do
    local rec = redis.call('HMGET', session_key(m), 'worker', 'held', 'active')
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
  redis.call('DEL', K.kv_tokens, K.live_sessions)
  for _, url in ipairs(redis.call('SMEMBERS', K.workers_set)) do
    redis.call('HSET', worker_key(url), 'sessions', sessions[url] or 0)
  end
  for url, n in pairs(kv) do redis.call('HSET', K.kv_tokens, url, n) end
  for url, n in pairs(an) do redis.call('HSET', K.live_sessions, url, n) end
end

local function purge(idle, cutoff, template_cutoff)
  local act, live = K.active, K.live
  local orphans = false
  -- removals first: at maxmemory Redis refuses a script's first write unless
  -- it frees memory, and lets every later write of a script that has written
  local quiet = redis.call('ZRANGEBYSCORE', act, '-inf', '(' .. tostring(idle), 'LIMIT', 0, 512)
  for _, m in ipairs(quiet) do
    local sk = session_key(m)
    redis.call('ZREM', act, m)
    local rec = redis.call('HMGET', sk, 'worker', 'held', 'active')
    if not rec[1] then orphans = true end
    if rec[1] and rec[3] ~= '0' then
      redis.call('HSET', sk, 'active', '0')
      local held = tonumber(rec[2] or '0')
      if held ~= 0 then redis.call('HINCRBY', K.kv_tokens, rec[1], -held) end
      redis.call('HINCRBY', K.live_sessions, rec[1], -1)
    end
  end
  local stale = redis.call('ZRANGEBYSCORE', live, '-inf', '(' .. tostring(cutoff), 'LIMIT', 0, 512)
  for _, m in ipairs(stale) do
    local sk = session_key(m)
    local rec = redis.call('HMGET', sk, 'worker', 'held', 'active')
    redis.call('DEL', sk)
    redis.call('ZREM', live, m)
    redis.call('ZREM', act, m)
    if rec[1] then detach(rec[1], tonumber(rec[2] or '0'), rec[3] ~= '0') else orphans = true end
  end
  if orphans then recount() end
  -- the expired templates' own keys expire by their TTL; only the index needs trimming
  -- (checked first: a no-op removal would count as this script's first write)
  local tu, below = K.templates_in_use, '(' .. tostring(template_cutoff)
  if #redis.call('ZRANGEBYSCORE', tu, '-inf', below, 'LIMIT', 0, 1) > 0 then
    redis.call('ZREMRANGEBYSCORE', tu, '-inf', below)
  end
end
