--[[
  End unique locks of one queue, each only while it still holds the id of the message whose
  outcome is settled (a lock that expired and was taken by another message is left alone).

  Input:
    KEYS[1]     unique hash (lock -> message id '@' when it ends)

    ARGV        pairs: lock, the id it must hold to be released

  Output:
    how many were released
]]
-- @include _lib

local n = #ARGV / 2
local locks = {}
for i = 1, n do
  locks[i] = ARGV[2 * i - 1]
end
local gone = {}
local i = 1
while i <= n do
  local j = math.min(i + CHUNK - 1, n)
  local holders = redis.call('HMGET', KEYS[1], unpack(locks, i, j))
  for k = 1, j - i + 1 do
    local value = holders[k]
    local id = ARGV[2 * (i + k - 1)]
    if value and string.sub(value, 1, #id + 1) == id .. '@' then
      gone[#gone + 1] = locks[i + k - 1]
    end
  end
  i = j + 1
end
call_chunked('HDEL', KEYS[1], gone)
return #gone
