-- Settles a cost reservation (weir-core's `cost` model, atomically). KEYS[1]: the rule's
-- state key. ARGV[2] (n): the actual cost; ARGV[5]: 'time' (GCRA, token bucket: the state is
-- the time from which units are free) or 'window' (fixed window: {i, c}); ARGV[6]: the
-- interval per unit, or the window (us); ARGV[7]: the estimate held; ARGV[8]: when it was
-- taken (us, the reservation's script time; -1: now). An excess is charged whatever the limit (a
-- debt); a refund gives back what was not used, whenever the call ends, but never past a full
-- state ('time': not before now) and never to a fixed window that ended.
local kind = ARGV[5]
local p = tonumber(ARGV[6])
local estimate = tonumber(ARGV[7])
local taken = tonumber(ARGV[8])
if taken < 0 then
  taken = now
end
local actual = n
if kind == 'time' then
  local t = tonumber(redis.call('GET', KEYS[1])) or 0
  if actual > estimate then
    t = math.max(t, now) + (actual - estimate) * p
    redis.call('SET', KEYS[1], t, 'PX', weir_ms(t - now))
  elseif actual < estimate and t > now then
    t = math.max(t - (estimate - actual) * p, now)
    if t > now then
      redis.call('SET', KEYS[1], t, 'PX', weir_ms(t - now))
    else
      redis.call('DEL', KEYS[1])
    end
  end
else
  local index = math.floor(now / p)
  local s = redis.call('HMGET', KEYS[1], 'i', 'c')
  local si, sc = tonumber(s[1]), tonumber(s[2]) or 0
  if actual > estimate then
    if si == index then
      redis.call('HSET', KEYS[1], 'c', sc + actual - estimate)
    else
      redis.call('HSET', KEYS[1], 'i', index, 'c', actual - estimate)
      redis.call('PEXPIRE', KEYS[1], weir_ms(p - (now - index * p)))
    end
  elseif actual < estimate and si == index and math.floor(taken / p) == index then
    redis.call('HSET', KEYS[1], 'c', math.max(sc - (estimate - actual), 0))
  end
end
return {1, limit, 0, 0, 0, now}
