-- Distributed concurrency limit. KEYS[1]: sorted set of held slots scored by lease expiry (us),
-- so a crashed holder's slots return when its lease expires. ARGV[5]: lease TTL (us),
-- ARGV[6]: lease id. n = 0 checks only. Answer as the rate scripts (reset = when the last
-- lease held now expires).
local ttl = tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
local function reset()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #last == 0 then return 0 end
  return math.max(tonumber(last[2]) - now, 0)
end
if need > limit then
  return {0, limit, math.max(limit - held, 0), -1, reset(), now}
end
if held + need > limit then
  local first = redis.call('ZRANGE', KEYS[1], held + need - limit - 1, held + need - limit - 1, 'WITHSCORES')
  return {0, limit, math.max(limit - held, 0), math.max(tonumber(first[2]) - now, 0), reset(), now}
end
if n > 0 then
  local args = {}
  for i = 1, n do
    args[#args + 1] = now + ttl
    args[#args + 1] = ARGV[6] .. ':' .. i
  end
  redis.call('ZADD', KEYS[1], unpack(args))
  redis.call('PEXPIRE', KEYS[1], weir_ms(ttl))
  held = held + n
end
return {1, limit, limit - held, 0, reset(), now}
