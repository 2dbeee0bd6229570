-- Bucketed sliding window. KEYS[1]: hash {bucket index -> count}, at most `buckets` live
-- fields (older ones deleted on the way). ARGV[5]: bucket length (us), ARGV[6]: buckets.
local bl = tonumber(ARGV[5])
local b = tonumber(ARGV[6])
local flat = redis.call('HGETALL', KEYS[1])
local idx, cnt = {}, {}
local newest_stored = -1
for i = 1, #flat, 2 do
  local x = tonumber(flat[i])
  idx[#idx + 1] = x
  cnt[#cnt + 1] = tonumber(flat[i + 1])
  if x > newest_stored then newest_stored = x end
end
local cur = math.max(math.floor(now / bl), newest_stored)
-- live buckets, oldest first; stale ones removed
local live = {}
for j = 1, #idx do
  if idx[j] > cur - b then
    if cnt[j] > 0 then live[#live + 1] = {idx[j], cnt[j]} end
  else
    redis.call('HDEL', KEYS[1], idx[j])
  end
end
table.sort(live, function(x, y) return x[1] < y[1] end)
local sum = 0
for j = 1, #live do sum = sum + live[j][2] end
local function reset(newest)
  if newest == nil then return 0 end
  return math.max((newest + b) * bl - now, 0)
end
local newest = nil
if #live > 0 then newest = live[#live][1] end
local remaining = math.max(limit - sum, 0)
if need > limit then
  return {0, limit, remaining, -1, reset(newest), now}
end
if sum + need > limit then
  local freed, retry = 0, 0
  for j = 1, #live do
    freed = freed + live[j][2]
    if sum - freed + need <= limit then
      retry = math.max((live[j][1] + b) * bl - now, 0)
      break
    end
  end
  if count_denied and n > 0 then
    redis.call('HINCRBY', KEYS[1], cur, n)
    redis.call('PEXPIRE', KEYS[1], weir_ms((cur + b) * bl - now))
  end
  return {0, limit, remaining, retry, reset(newest), now}
end
if n > 0 then
  redis.call('HINCRBY', KEYS[1], cur, n)
  redis.call('PEXPIRE', KEYS[1], weir_ms((cur + b) * bl - now))
  sum = sum + n
  newest = cur
end
return {1, limit, limit - sum, 0, reset(newest), now}
