--[[
  Delete dead letters of one queue by id.

  Input:
    KEYS[1]      dead zset
    KEYS[2]      dead raw hash
    KEYS[3]      dead reason hash

    ARGV[1]      the index of dead letters by message id, '' on a Redis Cluster (_lib.lua)
    ARGV[2]      the queue's name
    ARGV[3..]    dead-letter ids

  Output:
    { how many of the ids existed, index changes (ARGV[1] = '' only)... }
]]
-- @include _lib

local changes = {}
local ids = {}
for k = 3, #ARGV do
  ids[#ids + 1] = ARGV[k]
end
unindex_dead(ARGV[1], changes, KEYS[2], ARGV[2], ids)
local n = 0
local i = 3
while i <= #ARGV do
  local j = math.min(i + CHUNK - 1, #ARGV)
  n = n + redis.call('ZREM', KEYS[1], unpack(ARGV, i, j))
  redis.call('HDEL', KEYS[2], unpack(ARGV, i, j))
  redis.call('HDEL', KEYS[3], unpack(ARGV, i, j))
  i = j + 1
end
table.insert(changes, 1, n)
return changes
