-- In-flight counts are leases: ':lease:<source>' holds what one router has in
-- flight per worker, and ':leases' when each router's lease ends unless renewed
-- (every route renews it; a router with calls in flight renews it in the
-- background). A router that died (a killed client) stops renewing, and the
-- next route or renewal by anyone takes its counts out of ':inflight'.
local function reclaim_leases(now)
  local lz, ikey = K.leases, K.inflight
  for _, src in ipairs(redis.call('ZRANGEBYSCORE', lz, '-inf', '(' .. tostring(now), 'LIMIT', 0, 16)) do
    local lk = lease_key(src)
    local held = redis.call('HGETALL', lk)
    redis.call('DEL', lk)
    redis.call('ZREM', lz, src)
    for i = 1, #held, 2 do
      local c = tonumber(held[i + 1])
      if c > 0 and redis.call('HINCRBY', ikey, held[i], -c) < 0 then redis.call('HSET', ikey, held[i], 0) end
    end
  end
end

local function hold(source, url, now, lease_ms)
  if source == nil or source == '' or lease_ms <= 0 then return end
  local lk = lease_key(source)
  -- its day-long TTL is set as it gains a call, and renewed by every release and RENEW
  if redis.call('HINCRBY', lk, url, 1) == 1 then redis.call('PEXPIRE', lk, 86400000) end
  redis.call('ZADD', K.leases, tostring(now + lease_ms), source)
end
