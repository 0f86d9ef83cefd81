--[[
  A worker leaves one queue: everything it still holds goes back to the front of the ready
  lists, oldest first, and its heartbeat record is removed.

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     in-flight index of the worker (batch id -> count held)
    KEYS[12]     workers zset
    KEYS[13]     wake list

    ARGV[1]      worker id

  Output:
    how many deliveries went back
]]
-- @include _lib

local moved = requeue_all(KEYS[11], KEYS)
redis.call('ZREM', KEYS[12], ARGV[1])
if moved > 0 then
  wake_one(KEYS[13])
end
return moved
