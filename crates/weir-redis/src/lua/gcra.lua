-- GCRA. KEYS[1]: theoretical arrival time (us). ARGV[5]: emission interval T (us),
-- ARGV[6]: burst. TTL = time until the bucket is full again.
local T = tonumber(ARGV[5])
local burst = tonumber(ARGV[6])
local tol = burst * T
local tat = tonumber(redis.call('GET', KEYS[1])) or 0
local start = math.max(tat, now)
local horizon = now + tol
local function remaining(at)
  return math.max(math.floor((horizon - at) / T), 0)
end
if need > burst then
  return {0, limit, remaining(start), -1, start - now, now}
end
local new_tat = start + need * T
if new_tat > horizon then
  if count_denied and n > 0 then
    -- abuse protection: denied units count too, at most one window of penalty
    local penalised = math.min(new_tat, horizon + limit * T)
    redis.call('SET', KEYS[1], penalised, 'PX', weir_ms(penalised - now))
  end
  return {0, limit, remaining(start), new_tat - horizon, start - now, now}
end
local finish = start
if n > 0 then
  finish = new_tat
  redis.call('SET', KEYS[1], finish, 'PX', weir_ms(finish - now))
end
return {1, limit, remaining(finish), 0, finish - now, now}
