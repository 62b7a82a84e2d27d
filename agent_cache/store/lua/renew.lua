-- KEYS: the deployment's (store/keys.py). ARGV: tag, now (ms), lease (ms), the router's calls
-- in flight per worker ("url count" lines), then its release batch (source
-- first). Sets the router's lease to what it really has in flight (a count
-- left by a reply that never arrived is corrected here) and renews it.
-- needs: releases leases
local now, lease_ms = tonumber(ARGV[2]), tonumber(ARGV[3])
apply_releases(5)
reclaim_leases(now)
local source, ikey = ARGV[5], K.inflight
local lk = lease_key(source)
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
  redis.call('ZADD', K.leases, tostring(now + lease_ms), source)
else
  redis.call('ZREM', K.leases, source)
end
return 1
