-- A leader steps down: stores its last snapshot and deletes the leader key, if it still
-- holds it. KEYS as leader.lua; ARGV[1]: identity; ARGV[2]: token; ARGV[3]: snapshot ("":
-- none); ARGV[4]: the snapshot's time to live (ms). Answers 1 if it held the key.
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[2] .. '|' .. ARGV[1] then
  return 0
end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
end
redis.call('DEL', KEYS[1])
return 1
