--[[
  Whether a worker still holds one delivery: fetched, not settled, not recovered (read only).

  Input:
    KEYS[1]      in-flight index of the worker (batch id -> count held)

    ARGV[1]      batch id of the delivery
    ARGV[2]      its index in the batch

  Output:
    1 if the worker holds it, 0 if not
]]

if not redis.call('HGET', KEYS[1], ARGV[1]) then
  return 0
end
return 1 - redis.call('GETBIT', KEYS[1] .. ':' .. ARGV[1] .. ':done', ARGV[2])
