--[[
  Delete dead letters of one queue by id.

  Input:
    KEYS[1]      dead zset
    KEYS[2]      dead raw hash
    KEYS[3]      dead reason hash

    ARGV[1..]    dead-letter ids

  Output:
    how many of the ids existed
]]
-- @include _lib

local n = 0
local i = 1
while i <= #ARGV do
  local j = math.min(i + CHUNK - 1, #ARGV)
  n = n + redis.call('ZREM', KEYS[1], unpack(ARGV, i, j))
  redis.call('HDEL', KEYS[2], unpack(ARGV, i, j))
  redis.call('HDEL', KEYS[3], unpack(ARGV, i, j))
  i = j + 1
end
return n
