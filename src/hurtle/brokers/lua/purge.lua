--[[
  Drop the messages of one queue that wait to be fetched: ready (every priority), delayed, and
  quarantined (recovered messages waiting to be let out one at a time, which count as ready).
  What workers hold (in flight) is left alone, as are the dead letters.

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     delayed zset
    KEYS[12]     quarantine list
    KEYS[13]     wake list (its tokens would wake consumers for messages that are gone)

  Output:
    how many messages were dropped
]]

local n = 0
for p = 1, 10 do
  n = n + redis.call('LLEN', KEYS[p])
end
n = n + redis.call('ZCARD', KEYS[11]) + redis.call('LLEN', KEYS[12])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8],
  KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13])
return n
