-- Sliding log: the exact sliding window. KEYS[1]: sorted set of units scored by time,
-- bounded to the limit (at most `limit` units are ever live). KEYS[2]: unit sequence counter
-- (unique members). ARGV[5]: window (us).
local w = tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - w)
local live = redis.call('ZCARD', KEYS[1])
local function reset()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #last == 0 then return 0 end
  return math.max(tonumber(last[2]) + w - now, 0)
end
local function add(k)
  local top = redis.call('INCRBY', KEYS[2], k)
  local args = {}
  for i = top - k + 1, top do
    args[#args + 1] = now
    args[#args + 1] = i
  end
  redis.call('ZADD', KEYS[1], unpack(args))
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(limit + 1))
  redis.call('PEXPIRE', KEYS[1], weir_ms(w))
  redis.call('PEXPIRE', KEYS[2], weir_ms(w))
end
if need > limit then
  return {0, limit, math.max(limit - live, 0), -1, reset(), now}
end
if live + need > limit then
  local k = live + need - limit
  local oldest = redis.call('ZRANGE', KEYS[1], k - 1, k - 1, 'WITHSCORES')
  local retry = math.max(tonumber(oldest[2]) + w - now, 0)
  local rst = reset()
  if count_denied and n > 0 then
    add(n)
  end
  return {0, limit, math.max(limit - live, 0), retry, rst, now}
end
if n > 0 then
  add(n)
  live = live + n
end
return {1, limit, limit - live, 0, reset(), now}
