-- A session counts in its worker's footprint (':kv', ':an') while it is used
-- within the live window; quiet sessions give their KV tokens back (':act'
-- indexes them by last use), and come back into the count on their next call
-- or report. Expired sessions are forgotten (':live' indexes them). Both
-- passes are a single range read on most decisions.
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
