-- KEYS: session, template zset. ARGV: tag, member, worker, epoch, then the
-- release batch. Port of MemoryStore.abandon: the first call of a placement
-- failed, so the pin, its KV estimate and the template mark it set go.
-- needs: releases footprint
local tag, member, worker = ARGV[1], ARGV[2], ARGV[3]
local epoch = tonumber(ARGV[4])
apply_releases(tag, 5)
local rec = redis.call('HMGET', KEYS[1], 'worker', 'epoch', 'held', 'active', 'last_seen', 'tprev')
if rec[1] ~= worker or tonumber(rec[2]) ~= epoch then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', tag .. ':live', member)
redis.call('ZREM', tag .. ':act', member)
detach(tag, worker, tonumber(rec[3] or '0'), rec[4] ~= '0')
local mark = redis.call('ZSCORE', KEYS[2], worker)
if mark and tonumber(mark) == tonumber(rec[5]) then
  if rec[6] and rec[6] ~= '' then
    redis.call('ZADD', KEYS[2], rec[6], worker)
  else
    redis.call('ZREM', KEYS[2], worker)
  end
end
return 1
