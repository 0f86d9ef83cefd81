--[[
  Take up to ARGV[3] tokens of one rate limit: a generic cell rate (GCRA) in the server's clock,
  `limit` tokens per `period`, one every period / limit seconds, at most a tenth of `limit`
  (and at least 2) at once. Same arithmetic as ``common.gcra`` (memory and SQLite brokers).

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
local tolerance = (math.max(2, math.floor(limit / 10)) - 1) * interval
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then
  tat = now
end
local room = math.floor((now + tolerance - tat) / interval + 1e-4) + 1
local granted = math.max(0, math.min(wanted, room))
tat = tat + granted * interval
local wait = 0
if granted < wanted then
  wait = math.max(tat - tolerance - now, 0)
end
redis.call('SET', KEYS[1], string.format('%.6f', tat), 'PX',
  math.max(math.ceil((tat - now) * 1000), 1))
return { granted, string.format('%.6f', wait) }
