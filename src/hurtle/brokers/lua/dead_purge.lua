--[[
  Delete every dead letter of one queue.

  Input:
    KEYS[1]      dead zset
    KEYS[2]      dead raw hash
    KEYS[3]      dead reason hash

    ARGV[1]      the index of dead letters by message id, '' on a Redis Cluster (_lib.lua)
    ARGV[2]      the queue's name

  Output:
    { how many dead letters there were, index changes (ARGV[1] = '' only)... }
]]
-- @include _lib

local n = redis.call('ZCARD', KEYS[1])
local changes = {}
unindex_dead(ARGV[1], changes, KEYS[2], ARGV[2], redis.call('HKEYS', KEYS[2]))
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
table.insert(changes, 1, n)
return changes
