-- KEYS: the deployment's (store/keys.py), then session, template zset. ARGV:
-- tag, member, worker, epoch, then the release batch. Port of
-- MemoryStore.abandon: the first call of a placement failed, so the pin, its
-- KV estimate and the template mark it set go.
-- needs: releases footprint
local skey, tkey = KEYS[OWN], KEYS[OWN + 1]
local member, worker = ARGV[2], ARGV[3]
local epoch = tonumber(ARGV[4])
apply_releases(5)
local rec = redis.call('HMGET', skey, 'worker', 'epoch', 'held', 'active', 'last_seen', 'tprev')
if rec[1] ~= worker or tonumber(rec[2]) ~= epoch then return 0 end
redis.call('DEL', skey)
redis.call('ZREM', K.live, member)
redis.call('ZREM', K.active, member)
detach(worker, tonumber(rec[3] or '0'), rec[4] ~= '0')
local mark = redis.call('ZSCORE', tkey, worker)
if mark and tonumber(mark) == tonumber(rec[5]) then
  if rec[6] and rec[6] ~= '' then
    redis.call('ZADD', tkey, rec[6], worker)
  else
    redis.call('ZREM', tkey, worker)
  end
end
return 1
