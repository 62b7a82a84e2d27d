-- Shared by ROUTE, REPORT and RELEASE: in-flight releases the caller owes
-- (agent_cache.store.base.ReleaseBatch). ARGV from ``first``: the source (one
-- router), then url, running total, unacknowledged delta triples. The last
-- total applied per source and worker is kept, so a batch delivered twice
-- (resent after a timeout) is applied once.
local function apply_releases(first)
  local source = ARGV[first]
  if source == nil then return end
  local key = K.inflight
  local rkey = releases_applied_key(source)
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
        local lk = lease_key(source)
        if redis.call('HINCRBY', lk, url, -count) < 0 then redis.call('HSET', lk, url, 0) end
      end
    end
  end
  -- a router that released nothing for a day starts over from its deltas (only after
  -- a release: at maxmemory a first write that is not refused would let the script grow memory)
  if source ~= '' and #ARGV > first then
    redis.call('PEXPIRE', rkey, 86400000)
    redis.call('PEXPIRE', lease_key(source), 86400000)  -- a no-op when it does not exist
  end
end
