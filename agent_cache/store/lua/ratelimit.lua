-- Per-tenant limits: a sliding window of the last 60 one-second buckets, on Redis's clock so that
-- every gateway replica reads the same window.
-- KEYS: the tenant's request buckets, its token buckets (hashes: second -> count), the replicas
-- (sorted set: replica -> expiry, ms).
-- ARGV: op ("admit" or "settle"), rpm (0: none), tpm (0: none), tokens, replica, replica TTL (ms),
-- and for settle: the second the call was admitted in, the tokens it really used.
-- admit: refused while the requests of the window reach rpm or its tokens reach tpm (a tenant in
-- debt waits until the window is under the limit again); else one request is counted and ``tokens``
-- (the call's reservation) are put in the current bucket at once.
-- settle: the call ended; ``tokens`` (what it used less its reservation, negative for a refund) go to
-- the bucket of its admission while that is in the window, else what it used goes to the current one.
-- Returns {admitted (0/1), requests used, ms until under rpm, ms until the requests' window is empty,
-- tokens used, ms until under tpm, ms until the tokens' window is empty, live replicas, the second}.
local WINDOW = 60
local op, rpm, tpm, tokens = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now = sec * 1000 + math.floor(tonumber(t[2]) / 1000)

redis.call('ZADD', KEYS[3], now + tonumber(ARGV[6]), ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[6]))
local replicas = redis.call('ZCARD', KEYS[3])

-- used, ms until used < limit, ms until the window is empty
local function window(key, limit)
  local raw = redis.call('HGETALL', key)
  local buckets, used, newest = {}, 0, nil
  for i = 1, #raw, 2 do
    local s, c = tonumber(raw[i]), tonumber(raw[i + 1])
    if s <= sec - WINDOW then
      redis.call('HDEL', key, raw[i])
    else
      buckets[#buckets + 1] = {s, c}
      used = used + c
      if newest == nil or s > newest then newest = s end
    end
  end
  local under, empty = 0, 0
  if newest ~= nil then empty = (newest + WINDOW) * 1000 - now end
  if used >= limit then
    table.sort(buckets, function(a, b) return a[1] < b[1] end)
    local left = used
    for _, b in ipairs(buckets) do
      left = left - b[2]
      if left < limit then under = (b[1] + WINDOW) * 1000 - now; break end
    end
  end
  return used, under, empty
end

local function count(key, n)
  redis.call('HINCRBY', key, tostring(sec), n)
  redis.call('PEXPIRE', key, (WINDOW + 1) * 1000)
end

if op == 'settle' then
  local admitted_in, used = tonumber(ARGV[7]), tonumber(ARGV[8])
  if admitted_in > sec - WINDOW then
    if tokens ~= 0 then
      redis.call('HINCRBY', KEYS[2], tostring(admitted_in), tokens)
      redis.call('PEXPIRE', KEYS[2], (WINDOW + 1) * 1000)
    end
  elseif used > 0 then
    count(KEYS[2], used)
  end
  return {1, 0, 0, 0, 0, 0, 0, replicas, sec}
end

local rused, runder, rempty, tused, tunder, tempty = 0, 0, 0, 0, 0, 0
if rpm > 0 then rused, runder, rempty = window(KEYS[1], rpm) end
if tpm > 0 then tused, tunder, tempty = window(KEYS[2], tpm) end
local admitted = (rpm == 0 or rused < rpm) and (tpm == 0 or tused < tpm)
if admitted and rpm > 0 then
  count(KEYS[1], 1)
  rused = rused + 1
  rempty = WINDOW * 1000 - (now - sec * 1000)
end
if admitted and tpm > 0 and tokens > 0 then
  count(KEYS[2], tokens)
  tused = tused + tokens
  tempty = WINDOW * 1000 - (now - sec * 1000)
end
return {admitted and 1 or 0, rused, runder, rempty, tused, tunder, tempty, replicas, sec}
