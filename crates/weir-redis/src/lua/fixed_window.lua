-- Fixed window. KEYS[1]: hash {i = window index, c = count}. ARGV[5]: window (us).
-- The expiry is set once, when a window's first unit is counted: never refreshed per hit.
local w = tonumber(ARGV[5])
local index = math.floor(now / w)
local offset = now - index * w
local s = redis.call('HMGET', KEYS[1], 'i', 'c')
local si, sc = tonumber(s[1]), tonumber(s[2]) or 0
local cur, count, until_end = index, 0, w - offset
if si == index then
  count = sc
elseif si == index + 1 then
  -- a caller clock slightly behind: count it in the newer stored window
  cur, count, until_end = si, sc, w - offset + w
end
local function store(c)
  redis.call('HSET', KEYS[1], 'i', cur, 'c', c)
  if si ~= cur then
    redis.call('PEXPIRE', KEYS[1], weir_ms(until_end))
  end
end
local function reset(c)
  if c > 0 then return until_end end
  return 0
end
if need > limit then
  if count_denied and n > 0 then
    count = count + n
    store(count)
  end
  return {0, limit, math.max(limit - count, 0), -1, reset(count), now}
end
if count + need > limit then
  if count_denied and n > 0 then
    store(count + n)
  end
  return {0, limit, math.max(limit - count, 0), until_end, until_end, now}
end
if n > 0 then
  count = count + n
  store(count)
end
return {1, limit, limit - count, 0, reset(count), now}
