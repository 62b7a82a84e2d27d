-- A template's records (':t:', ':ts:', ':ti:', ':tis:') expire ``retention`` ms
-- after its last use, so they go with its last session; ':tu' indexes the
-- templates in use by last use (stats read the recent ones, the route script
-- drops the expired members). Their expiry is pushed back at most once a
-- second (retention is at least the session TTL): six commands on every call
-- were a sixth of the route script's work. A record a script creates gets its
-- TTL from that script (``expire_new``).
local function touch_template(tmember, now, retention)
  local last = redis.call('ZSCORE', K.templates_in_use, tmember)
  if last and tonumber(now) - tonumber(last) < math.min(1000, retention / 4) then return end
  for _, key in ipairs({template_key, template_stats_key, template_info_key, template_sessions_key}) do
    redis.call('PEXPIRE', key(tmember), retention)  -- a no-op for a record not written yet
  end
  local tu = K.templates_in_use
  redis.call('ZADD', tu, tostring(now), tmember)
  redis.call('PEXPIRE', tu, retention)
end

local function expire_new(key, created, retention)
  if created then redis.call('PEXPIRE', key, retention) end
end
