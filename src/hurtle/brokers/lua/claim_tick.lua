--[[
  Claim one tick of a schedule and publish its messages, in one step: if the schedule's last
  tick is older than this one (or it has none), record this one and publish; else do nothing.
  Every worker's scheduler sends this for every tick, so exactly one of them publishes it, and a
  late caller with an older tick never publishes after a newer one.

  Input:
    KEYS[1]      the schedule's record (STRING: its last tick), under the queue's hash tag
    KEYS[2..]    publish.lua's KEYS for the queue

    ARGV[1]      the tick (Unix seconds)
    ARGV[2..]    as publish.lua's ARGV

  Output:
    1 if this call claimed the tick (and published), 0 if it was claimed already
]]

-- publish.lua itself, as a function of its keys and arguments.
local function publish(KEYS, ARGV)
-- @include publish
end

local tick = tonumber(ARGV[1])
local last = redis.call('GET', KEYS[1])
if last and tonumber(last) >= tick then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
local keys = {}
for i = 2, #KEYS do
  keys[i - 1] = KEYS[i]
end
local args = {}
for i = 2, #ARGV do
  args[i - 1] = ARGV[i]
end
publish(keys, args)
return 1
