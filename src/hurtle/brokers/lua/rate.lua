--[[
  Take up to ARGV[3] tokens of one rate limit: a generic cell rate (GCRA) in the server's clock,
  at most `limit` tokens per `period`, a burst of at most `limit`. Same arithmetic as
  ``base.gcra`` (memory and SQLite brokers).

  Input:
    KEYS[1]  the limit's theoretical arrival time (STRING, server seconds; expires once past)

    ARGV[1]  limit: tokens per period (int >= 1)
    ARGV[2]  period in seconds
    ARGV[3]  tokens wanted

  Output:
    { tokens granted, seconds until the next token is due when fewer were granted (string) }
]]
-- @include _lib

local now = server_now()
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local wanted = tonumber(ARGV[3])
local interval = period / limit
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then
  tat = now
end
local room = math.floor((now + period - tat) / interval + 1e-9)
local granted = math.max(0, math.min(wanted, room))
tat = tat + granted * interval
local wait = 0
if granted < wanted then
  wait = math.max(tat + interval - period - now, 0)
end
redis.call('SET', KEYS[1], string.format('%.6f', tat), 'PX',
  math.max(math.ceil((tat - now) * 1000), 1))
return { granted, string.format('%.6f', wait) }
