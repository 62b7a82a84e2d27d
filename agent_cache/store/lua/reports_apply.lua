-- Usage reports a router queued (they ride on its next store write, so a call
-- costs one round trip). ARGV from ``first``: their count, the session key TTL
-- and the template retention (ms), then per report the session member, worker,
-- epoch, template id, template member, prompt tokens, cached tokens, now (ms).
-- Returns the index after them.
local function apply_report(member, worker, epoch, tid, tmember, p, c, now, skey_ttl, retention)
  local sk = session_key(member)
  local wk = worker_key(worker)
  redis.call('HINCRBY', wk, 'prompt_tokens', p)
  redis.call('HINCRBY', wk, 'cached_tokens', c)
  redis.call('HINCRBY', K.usage, 'uncached', math.max(0, p - c))
  redis.call('HINCRBY', K.usage, 'calls', 1)
  local rec = redis.call('HMGET', sk, 'worker', 'epoch', 'last_cached', 'held', 'active', 'quiet')
  if rec[1] == worker and tonumber(rec[2]) == epoch then
    local open = redis.call('HINCRBY', sk, 'open', -1)
    if open < 0 then redis.call('HSET', sk, 'open', 0); open = 0 end
    if open == 0 or rec[5] == '0' then  -- else another call is running: its route's time stands
      -- the call ended: live while its next one may come
      activate(sk, member, worker, tonumber(rec[4] or '0'), rec[5] ~= '0', tonumber(now) + tonumber(rec[6] or '0'))
    end
    redis.call('HINCRBY', sk, 'prompt_tokens', p)
    redis.call('HINCRBY', sk, 'cached_tokens', c)
    redis.call('HSET', sk, 'prev_cached', rec[3], 'last_cached', c, 'last_seen', now, 'held', p)
    local held = tonumber(rec[4] or '0')
    if p ~= held then redis.call('HINCRBY', K.kv_tokens, worker, p - held) end
    redis.call('ZADD', K.live, now, member)
    redis.call('PEXPIRE', sk, skey_ttl)
  end
  if tid ~= '' then
    local ts, tk = template_stats_key(tmember), template_key(tmember)
    local total = redis.call('HINCRBY', ts, 'prompt_tokens', p)
    redis.call('HINCRBY', ts, 'cached_tokens', c)
    local added = redis.call('ZADD', tk, now, worker)
    touch_template(tmember, now, retention)
    expire_new(ts, total == p, retention)  -- (or a template whose first reports were all 0 tokens)
    expire_new(tk, added == 1, retention)
  end
end

local function apply_reports(first)
  local n = tonumber(ARGV[first] or '0')
  if n == 0 then return first + 1 end
  local skey_ttl, retention = tonumber(ARGV[first + 1]), tonumber(ARGV[first + 2])
  for i = 0, n - 1 do
    local j = first + 3 + 8 * i
    apply_report(ARGV[j], ARGV[j + 1], tonumber(ARGV[j + 2]), ARGV[j + 3], ARGV[j + 4],
      tonumber(ARGV[j + 5]), tonumber(ARGV[j + 6]), ARGV[j + 7], skey_ttl, retention)
  end
  return first + 3 + 8 * n
end
