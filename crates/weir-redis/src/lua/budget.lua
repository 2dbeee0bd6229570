-- A calendar budget's count of one key in one period (weir-core's `budget`), atomically; no
-- prelude: the period is the caller's (its name is in the key), Redis keeps the count only.
-- KEYS[1]: the count. ARGV[1]: 'take' or 'add'; ARGV[2]: units (take: ≥ 0; add: signed);
-- ARGV[3]: the limit; ARGV[4]: '1' for a hard budget; ARGV[5]: seconds the count is kept (the
-- period's end, plus a day for late settlements).
-- take: {1, count after} when admitted (a soft budget always is), {0, count} when a hard one
-- refuses. add: {1, count after}, never below 0.
local op = ARGV[1]
local n = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local hard = ARGV[4] == '1'
local ttl = math.max(1, tonumber(ARGV[5]))
local used = tonumber(redis.call('GET', KEYS[1])) or 0
if op == 'take' then
  if hard and used + n > limit then
    return {0, used}
  end
  used = used + n
else
  used = math.max(0, used + n)
end
redis.call('SET', KEYS[1], used, 'EX', ttl)
return {1, used}
