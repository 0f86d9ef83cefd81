--[[
  Give held deliveries back, unchanged, at the front of their ready lists, keeping their order
  (the first receipt given ends up at the head).

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     in-flight hash of the worker
    KEYS[12]     wake list

    ARGV[1..]    receipts, in the order the deliveries should run again

  Output:
    how many deliveries were still held and went back
]]
-- @include _lib

local back = 0
-- Chunks from the last one back to the first, each from its end: every LPUSH goes in front of
-- the receipts that come after it.
local n = #ARGV
local i = n - ((n - 1) % CHUNK)
while i >= 1 do
  local j = math.min(i + CHUNK - 1, n)
  local values = redis.call('HMGET', KEYS[11], unpack(ARGV, i, j))
  for k = j, i, -1 do
    local raw = values[k - i + 1]
    if raw then
      redis.call('LPUSH', KEYS[(tonumber(ARGV[k]) % 10) + 1], raw)
      back = back + 1
    end
  end
  redis.call('HDEL', KEYS[11], unpack(ARGV, i, j))
  i = i - CHUNK
end
if back > 0 then
  wake_one(KEYS[12])
end
return back
