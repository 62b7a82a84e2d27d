-- A session counts in its worker's footprint (':kv', ':an') while it is used
-- within the live window; quiet sessions give their KV tokens back (':act'
-- indexes them by last use), and come back into the count on their next call
-- or report. Expired sessions are forgotten (':live' indexes them). Both
-- passes are a single range read on most decisions.
local function detach(url, held, active)
  if active then
    if held ~= 0 then redis.call('HINCRBY', K.kv_tokens, url, -held) end
    redis.call('HINCRBY', K.live_sessions, url, -1)
  end
  redis.call('HINCRBY', worker_key(url), 'sessions', -1)
end

local function activate(sk, member, url, held, active, until_ms)
  if not active then
    if held ~= 0 then redis.call('HINCRBY', K.kv_tokens, url, held) end
    redis.call('HINCRBY', K.live_sessions, url, 1)
    redis.call('HSET', sk, 'active', '1')
  end
  redis.call('ZADD', K.active, tostring(until_ms), member)
end
