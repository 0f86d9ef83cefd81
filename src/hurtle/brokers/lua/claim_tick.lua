--[[
  Claim one tick of a schedule and publish its messages, in one step: if the schedule's last
  tick is older than this one (or it has none), and the tick is not more than the tolerated
  skew ahead of the server's clock, record this one and publish; else do nothing. Every
  worker's scheduler sends this for every tick, so exactly one of them publishes it, a late
  caller with an older tick never publishes after a newer one, and a caller whose clock runs
  ahead cannot record a tick long before its time.

  Input:
    KEYS[1]      the schedule's record (STRING: its last tick), under the queue's hash tag
    KEYS[2..14]  publish.lua's KEYS for the queue
    KEYS[15]     (unique tasks) the queue's unique hash, as publish_unique.lua's KEYS[14]
    KEYS[16]     (unique tasks) the unique sweep's cursor, as publish_unique.lua's KEYS[15]

    ARGV[1]      the tick (Unix seconds)
    ARGV[2]      how far (seconds) the tick may be ahead of the server's clock
    ARGV[3]      'p': ARGV[4..] are publish.lua's ARGV;
                 'u': the messages take their unique locks: ARGV[4] is a number of groups,
                 then per group its count of messages n, then publish_unique.lua's ARGV for
                 them (3 + 4n values)

  Output:
    {1, skipped}  claimed: recorded, and published (with 'u': skipped is publish_unique.lua's
                  output, its indexes counted over all groups)
    {0, ''}       claimed already (the last tick is this one or newer)
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
local last = redis.call('GET', KEYS[1])
if last and tonumber(last) >= tick then
  return {0, ''}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
if tick > now + tonumber(ARGV[2]) then
  return {-1, string.format('%.6f', now)}
end
redis.call('SET', KEYS[1], ARGV[1])
local keys = {}
for i = 2, 14 do
  keys[i - 1] = KEYS[i]
end
if ARGV[3] == 'p' then
  local args = {}
  for i = 4, #ARGV do
    args[i - 3] = ARGV[i]
  end
  publish(keys, args)
  return {1, {}}
end
keys[14] = KEYS[15]
keys[15] = KEYS[16]
local skipped = {}
local at = 5
local offset = 0
for _ = 1, tonumber(ARGV[4]) do
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
