-- Token bucket (Guava SmoothBursty, max wait 0). KEYS[1]: time F (us) at which the bucket is
-- full; missing = full. ARGV[5]: interval per token (us), ARGV[6]: burst (capacity).
local T = tonumber(ARGV[5])
local burst = tonumber(ARGV[6])
local cap = burst * T
local full_at = tonumber(redis.call('GET', KEYS[1])) or 0
local start = math.max(full_at, now)
local function remaining(at)
  return math.max(math.floor((now + cap - at) / T), 0)
end
if need > burst then
  return {0, limit, remaining(start), -1, start - now, now}
end
local wait = math.max(start - cap - now, 0)
if wait > 0 then
  if count_denied and n > 0 then
    local penalised = math.min(start + n * T, now + cap + limit * T)
    redis.call('SET', KEYS[1], penalised, 'PX', weir_ms(penalised - now))
  end
  return {0, limit, remaining(start), wait, start - now, now}
end
local finish = start
if n > 0 then
  finish = start + n * T
  redis.call('SET', KEYS[1], finish, 'PX', weir_ms(finish - now))
end
return {1, limit, remaining(finish), 0, finish - now, now}
