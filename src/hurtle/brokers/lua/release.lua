--[[
  Give held deliveries back, unchanged, at the front of their ready lists, keeping their order
  (the first one given ends up at the head).

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     in-flight index of the worker (batch id -> count held)
    KEYS[12]     wake list

    ARGV         triples in the order the deliveries should run again:
                 batch id, message index in the batch, payload

  Output:
    how many deliveries were still held and went back
]]
-- @include _lib

local back = 0
-- From the last triple to the first: every LPUSH goes in front of the ones after it.
for t = #ARGV - 2, 1, -3 do
  local batch = ARGV[t]
  if settle(KEYS[11], batch, tonumber(ARGV[t + 1])) == 1 then
    redis.call('LPUSH', KEYS[(tonumber(batch) % 10) + 1], ARGV[t + 2])
    back = back + 1
  end
end
if back > 0 then
  wake_one(KEYS[12])
end
return back
