--[[
  Concurrency slots of one key, held per worker. A worker's slots count only while its deadline
  (server time of its last acquire, release or refresh plus its heartbeat timeout) has not
  passed: the slots of a crashed worker are free once it is silent that long.

  Input:
    KEYS[1]  holders hash (worker id -> slots held)
    KEYS[2]  deadlines zset (worker id scored by its deadline)

    ARGV[1]  worker id
    ARGV[2]  its heartbeat timeout in seconds
    ARGV[3]  the limit: slots held at most, across all workers
    ARGV[4]  > 0: take up to that many; < 0: give back that many; 0: refresh the deadline of
             this worker if it holds any

  Output:
    slots taken (0 for a release or a refresh)
]]
-- @include _lib

local now = server_now()
local worker = ARGV[1]
local deadline = now + tonumber(ARGV[2])
local delta = tonumber(ARGV[4])
if delta == 0 then
  if redis.call('HEXISTS', KEYS[1], worker) == 1 then
    redis.call('ZADD', KEYS[2], deadline, worker)
  end
  return 0
end
if delta < 0 then
  if redis.call('HINCRBY', KEYS[1], worker, delta) <= 0 then
    redis.call('HDEL', KEYS[1], worker)
    redis.call('ZREM', KEYS[2], worker)
  else
    redis.call('ZADD', KEYS[2], deadline, worker)
  end
  return 0
end
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf',
    '(' .. string.format('%.6f', now))) do
  redis.call('HDEL', KEYS[1], dead)
  redis.call('ZREM', KEYS[2], dead)
end
local held = 0
for _, n in ipairs(redis.call('HVALS', KEYS[1])) do
  held = held + tonumber(n)
end
local granted = math.max(0, math.min(delta, tonumber(ARGV[3]) - held))
if granted > 0 then
  redis.call('HINCRBY', KEYS[1], worker, granted)
  redis.call('ZADD', KEYS[2], deadline, worker)
end
return granted
