--[[
  Claim one tick of a schedule and publish its messages, in one step: if the tick is not among
  the schedule's latest claimed ticks, nor older than all of them once KEEP are kept (a record
  with a last tick and no recent ones, from an older hurtle, takes newer ticks only), and is
  not more than the tolerated skew ahead of the server's clock, record it and publish; else do
  nothing. Every worker's scheduler sends this for every tick, so exactly one of them publishes
  it; a scheduler that owes an older tick (the broker was away) can still claim it after a
  newer one was claimed; a caller whose clock runs ahead cannot record a tick long before its
  time.

  Input:
    KEYS[1]      the schedule's last tick (STRING), under the queue's hash tag
    KEYS[2]      the schedule's latest claimed ticks (ZSET: member and score the tick)
    KEYS[3..15]  publish.lua's KEYS for the queue
    KEYS[16]     (unique tasks) the queue's unique hash, as publish_unique.lua's KEYS[14]
    KEYS[17]     (unique tasks) the unique sweep's cursor, as publish_unique.lua's KEYS[15]

    ARGV[1]      the tick (Unix seconds, as the member it is kept as)
    ARGV[2]      how far (seconds) the tick may be ahead of the server's clock
    ARGV[3]      KEEP: how many of the latest claimed ticks are kept
    ARGV[4]      'p': ARGV[5..] are publish.lua's ARGV;
                 'u': the messages take their unique locks: ARGV[5] is a number of groups,
                 then per group its count of messages n, then publish_unique.lua's ARGV for
                 them (3 + 4n values)

  Output:
    {1, skipped}  claimed: recorded, and published (with 'u': skipped is publish_unique.lua's
                  output, its indexes counted over all groups)
    {0, ''}       claimed already, or too old to tell
    {-1, now}     refused: the tick is ahead of the server's clock `now` by more than ARGV[2]
]]

-- publish.lua and publish_unique.lua themselves, as functions of their keys and arguments.
local function publish(KEYS, ARGV)
-- @include publish
end

local function publish_unique(KEYS, ARGV)
-- @include publish_unique
end

local tick = tonumber(ARGV[1])
local keep = tonumber(ARGV[3])
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return {0, ''}
end
local last = redis.call('GET', KEYS[1])
local kept = redis.call('ZCARD', KEYS[2])
if kept == 0 and last and tonumber(last) >= tick then
  return {0, ''}
end
if kept >= keep and tick <= tonumber(redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]) then
  return {0, ''}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
if tick > now + tonumber(ARGV[2]) then
  return {-1, string.format('%.6f', now)}
end
if not last or tonumber(last) < tick then
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('ZADD', KEYS[2], tick, ARGV[1])
if kept >= keep then
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, kept - keep)
end
local keys = {}
for i = 3, 15 do
  keys[i - 2] = KEYS[i]
end
if ARGV[4] == 'p' then
  local args = {}
  for i = 5, #ARGV do
    args[i - 4] = ARGV[i]
  end
  publish(keys, args)
  return {1, {}}
end
keys[14] = KEYS[16]
keys[15] = KEYS[17]
local skipped = {}
local at = 6
local offset = 0
for _ = 1, tonumber(ARGV[5]) do
  local n = tonumber(ARGV[at])
  local args = {}
  for i = 1, 3 + 4 * n do
    args[i] = ARGV[at + i]
  end
  local out = publish_unique(keys, args)
  for k = 1, #out, 2 do
    skipped[#skipped + 1] = out[k] + offset
    skipped[#skipped + 1] = out[k + 1]
  end
  at = at + 4 + 4 * n
  offset = offset + n
end
return {1, skipped}
