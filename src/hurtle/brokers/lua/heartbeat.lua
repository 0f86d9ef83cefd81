--[[
  Record a worker's heartbeat in one queue, then recover that queue from dead workers: whatever a
  worker held whose deadline passed goes back to the front of the ready lists.

  A worker's deadline is set by the worker itself (server time of its last beat or fetch plus its
  own heartbeat timeout), so workers with different timeouts judge each other fairly: a peer with
  a short timeout never takes what a live worker with a long one holds.

  Only the in-flight records matter here: delayed messages wait in the delayed zset whatever
  happens to workers, and a live worker's deliveries are never touched, however old.

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     workers zset (worker id scored by its deadline)
    KEYS[12]     wake list

    ARGV[1]      worker id to mark alive ('' = only recover)
    ARGV[2]      that worker's heartbeat timeout in seconds (its deadline is now + this)
    ARGV[3]      in-flight key prefix of this queue; a worker's in-flight index is
                 prefix .. worker id, its batches index .. ':' .. batch id
                 (same hash tag as KEYS, so still one slot)

  Output:
    how many deliveries went back to the ready lists
]]
-- @include _lib

local now = server_now()
if ARGV[1] ~= '' then
  redis.call('ZADD', KEYS[11], now + tonumber(ARGV[2]), ARGV[1])
end
local dead = redis.call('ZRANGEBYSCORE', KEYS[11], '-inf', '(' .. string.format('%.6f', now))
local moved = 0
for _, worker in ipairs(dead) do
  moved = moved + requeue_all(ARGV[3] .. worker, KEYS)
  redis.call('ZREM', KEYS[11], worker)
end
if moved > 0 then
  wake_one(KEYS[12])
end
return moved
