--[[
  Count one queue's messages in each state (read only).

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     delayed zset
    KEYS[12]     workers zset
    KEYS[13]     dead zset
    KEYS[14]     quarantine list (recovered messages let out one at a time: they count as ready)
    KEYS[15]     paused flag
    KEYS[16]     in-flight key prefix of this queue (no key of that name exists): prefix ..
                 worker id = the worker's index, batch id -> count held. Derived here from
                 this declared key, for each worker of KEYS[12]: same hash tag, same slot.

  Output:
    { ready, delayed, in_flight, dead, paused (1 or 0) }; in_flight counts what every registered worker holds,
    including workers whose heartbeat lapsed but who have not been recovered yet.
]]

local ready = 0
for p = 1, 10 do
  ready = ready + redis.call('LLEN', KEYS[p])
end
ready = ready + redis.call('LLEN', KEYS[14])
local in_flight = 0
for _, worker in ipairs(redis.call('ZRANGE', KEYS[12], 0, -1)) do
  for _, held in ipairs(redis.call('HVALS', KEYS[16] .. worker)) do
    in_flight = in_flight + tonumber(held)
  end
end
return { ready, redis.call('ZCARD', KEYS[11]), in_flight, redis.call('ZCARD', KEYS[13]),
  redis.call('EXISTS', KEYS[15]) }
