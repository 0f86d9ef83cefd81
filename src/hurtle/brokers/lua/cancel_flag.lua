--[[
  Raise one queue's cancels flag (a cancellation may be live) until a time, never lowering it:
  the flag expires with the latest cancellation made, whatever order cancels run in.

  Input:
    KEYS[1]   the queue's cancels flag
    ARGV[1]   when the cancellation ends, in Unix milliseconds

  Output: 1 when the flag was raised or extended, 0 when it already lasted as long.
]]
local until_ms = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if until_ms <= current then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[1])
return 1
