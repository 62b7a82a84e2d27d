-- KEYS[1]: a key of the deployment (its hash tag, so the scripts' Cluster slot). ARGV: the commands
-- the store runs on the deployment's keys. Returns the first one this client may not run there, or
-- '' when it may run them all (or when Redis before 7.0 cannot tell: the first refused call says so).
if not redis.acl_check_cmd then return '' end
for _, command in ipairs(ARGV) do
  if not redis.acl_check_cmd(command, KEYS[1]) then return command end
end
return ''
