--[[
  Delete every dead letter of one queue.

  Input:
    KEYS[1]      dead zset
    KEYS[2]      dead raw hash
    KEYS[3]      dead reason hash

  Output:
    how many dead letters there were
]]

local n = redis.call('ZCARD', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return n
