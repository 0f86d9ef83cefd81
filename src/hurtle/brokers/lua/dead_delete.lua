--[[
  Delete dead letters of one queue: those of the given ids, or every one (a purge).

  Input:
    KEYS[1]      dead zset
    KEYS[2]      dead raw hash
    KEYS[3]      dead reason hash

    ARGV[1]      the index of dead letters by message id, '' on a Redis Cluster (_lib.lua)
    ARGV[2]      the queue's name
    ARGV[3]      '*' to delete every dead letter of the queue, '' to delete those of ARGV[4..]
    ARGV[4..]    dead-letter ids (ARGV[3] = '' only)

  Output:
    { how many of them there were, index changes (ARGV[1] = '' only)... }
]]
-- @include _lib

local changes = {}
local n
if ARGV[3] == '*' then
  n = redis.call('ZCARD', KEYS[1])
  unindex_dead(ARGV[1], changes, KEYS[2], ARGV[2], redis.call('HKEYS', KEYS[2]))
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
else
  local ids = {}
  for k = 4, #ARGV do
    ids[#ids + 1] = ARGV[k]
  end
  n = drop_dead(ARGV[1], changes, KEYS[1], KEYS[2], KEYS[3], ARGV[2], ids)
end
table.insert(changes, 1, n)
return changes
