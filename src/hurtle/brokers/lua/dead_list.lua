--[[
  List dead letters of one queue, oldest first (read only).

  Input:
    KEYS[1]      dead zset (id scored by failure time)
    KEYS[2]      dead raw hash
    KEYS[3]      dead reason hash

    ARGV[1]      offset
    ARGV[2]      limit

  Output:
    { id1, failed_at1, reason1, payload1, id2, ... }  (failed_at as a decimal string)
]]

local offset = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
if limit <= 0 then
  return {}
end
local page = redis.call('ZRANGE', KEYS[1], offset, offset + limit - 1, 'WITHSCORES')
local out = {}
for i = 1, #page, 2 do
  local id = page[i]
  out[#out + 1] = id
  out[#out + 1] = page[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[3], id) or ''
  out[#out + 1] = redis.call('HGET', KEYS[2], id) or ''
end
return out
