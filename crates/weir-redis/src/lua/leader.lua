-- One campaign for the leadership of a group of lease servers (see src/leader.rs).
-- KEYS[1]: the leader key "TOKEN|IDENTITY"; KEYS[2]: the election counter (fencing tokens);
-- KEYS[3]: the leader's allocation snapshot.
-- ARGV[1]: this server's identity; ARGV[2]: the leader key's time to live (ms);
-- ARGV[3]: the token this server believes it holds (0: none); ARGV[4]: a snapshot to store
-- ("": none); ARGV[5]: the snapshot's time to live (ms).
-- Answers {1, token, 0} renewed, {1, token, 1, snapshot or nil} newly elected,
-- {0, token, identity} another server leads.
local current = redis.call('GET', KEYS[1])
if current then
  local sep = string.find(current, '|', 1, true)
  if not sep then
    return {0, 0, current}
  end
  local token = tonumber(string.sub(current, 1, sep - 1)) or 0
  local holder = string.sub(current, sep + 1)
  if holder == ARGV[1] and token == tonumber(ARGV[3]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    if ARGV[4] ~= '' then
      redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[5])
    end
    return {1, token, 0}
  end
  return {0, token, holder}
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. '|' .. ARGV[1], 'PX', ARGV[2])
local snapshot = redis.call('GET', KEYS[3])
return {1, token, 1, snapshot}
