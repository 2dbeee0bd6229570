-- Releases a lease of the concurrency script. KEYS[1]: its sorted set; ARGV[1]: lease id,
-- ARGV[2]: slots. Answers the slots removed.
local members = {}
for i = 1, tonumber(ARGV[2]) do
  members[#members + 1] = ARGV[1] .. ':' .. i
end
return redis.call('ZREM', KEYS[1], unpack(members))
