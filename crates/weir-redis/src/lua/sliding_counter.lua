-- Sliding window counter (previous window weighted by its overlap). KEYS[1]: hash
-- {i = window index, p = previous count, c = current count}. ARGV[5]: window in units of
-- ARGV[6] microseconds (1, or 1000 when limit × window would not be exact in a double).
local res = tonumber(ARGV[6])
local w = tonumber(ARGV[5])
local t = math.floor(now / res)
local index = math.floor(t / w)
local s = redis.call('HMGET', KEYS[1], 'i', 'p', 'c')
local si, prev, cur = tonumber(s[1]), tonumber(s[2]) or 0, tonumber(s[3]) or 0
if si == nil then
  si, prev, cur = index, 0, 0
elseif index == si + 1 then
  si, prev, cur = index, cur, 0
elseif index > si + 1 then
  si, prev, cur = index, 0, 0
end
local start = si * w
local e = math.min(math.max(t - start, 0), w - 1)
local function remaining(p, c)
  return math.max(limit - c - math.ceil(p * (w - e) / w), 0)
end
local function reset(p, c)
  local left = 0
  if c > 0 then left = 2 elseif p > 0 then left = 1 else return 0 end
  return math.max((si + left) * w - t, 0) * res
end
local function earliest(p, c)
  local room = limit - (c + need)
  if room < 0 then return nil end
  if p == 0 then return 0 end
  local x = w - math.floor(room * w / p)
  if x < 0 then x = 0 end
  if x < w then return x end
  return nil
end
local function store(p, c)
  redis.call('HSET', KEYS[1], 'i', si, 'p', p, 'c', c)
  -- the previous window must outlive the current one: keep until the end of the next window
  redis.call('PEXPIRE', KEYS[1], weir_ms(((si + 2) * w - t) * res))
end
if need > limit then
  return {0, limit, remaining(prev, cur), -1, reset(prev, cur), now}
end
if prev * (w - e) + (cur + need) * w > limit * w then
  local at
  local e2 = earliest(prev, cur)
  if e2 ~= nil and e2 > e then
    at = start + e2
  else
    local e3 = earliest(cur, 0)
    if e3 ~= nil then at = start + w + e3 else at = start + 2 * w end
  end
  local rem, rst = remaining(prev, cur), reset(prev, cur)
  if count_denied and n > 0 then
    store(prev, cur + n)
  end
  return {0, limit, rem, math.max(at - t, 0) * res, rst, now}
end
if n > 0 then
  cur = cur + n
  store(prev, cur)
end
return {1, limit, remaining(prev, cur), 0, reset(prev, cur), now}
