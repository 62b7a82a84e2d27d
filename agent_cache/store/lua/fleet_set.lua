-- Compare-and-set of one worker's entry on the fleet board.
-- KEYS: the fleet hash. ARGV: worker URL, the entry expected now ('' = none), the new entry ('' = delete it).
-- Returns 1 when written, 0 when the entry had changed (another replica wrote first).
local current = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if current ~= ARGV[2] then
  return 0
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
return 1
