-- Shared by every Weir script. Times are integer microseconds since the project epoch
-- (2026-01-01T00:00:00Z), exact in Lua's doubles for 285 years. ARGV[1] is the caller's time
-- or '' for Redis TIME (one clock for all instances). Every script answers
-- {allowed (0/1), limit, remaining, retry_after_us (-1 = never), reset_after_us, now_us}.
local function weir_now()
  if ARGV[1] ~= '' then
    return tonumber(ARGV[1])
  end
  local t = redis.call('TIME')
  return (tonumber(t[1]) - 1767225600) * 1000000 + tonumber(t[2])
end
local function weir_ms(us)
  return math.max(1, math.ceil(us / 1000))
end
local now = weir_now()
local n = tonumber(ARGV[2])
local count_denied = ARGV[3] == '1'
local limit = tonumber(ARGV[4])
local need = math.max(n, 1)
