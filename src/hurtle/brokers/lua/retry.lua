--[[
  Replace a held delivery by its next attempt, in the same queue: drop it from the worker's
  in-flight record and store the new payload, delayed until its eta or ready at once.

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     delayed zset
    KEYS[12]     in-flight index of the worker (batch id -> count held)
    KEYS[13]     wake list
    KEYS[14]     seq counter

    ARGV[1]      batch id of the held delivery
    ARGV[2]      its index in the batch
    ARGV[3]      priority of the new attempt (0..9)
    ARGV[4]      eta of the new attempt (Unix seconds; 0 = now)
    ARGV[5]      payload of the new attempt

  Output:
    1 if the delivery was still held and the new attempt is stored; 0 if it had been settled
    already or recovered from this worker (declared dead): then nothing is stored, the copy
    that went back to the queue is the one that lives.
]]
-- @include _lib

if settle(KEYS[12], ARGV[1], tonumber(ARGV[2])) == 0 then
  return 0
end
local eta = tonumber(ARGV[4])
if eta > server_now() then
  local seq = redis.call('INCR', KEYS[14])
  redis.call('ZADD', KEYS[11], eta, ARGV[3] .. string.format(':%012x:', seq) .. ARGV[5])
else
  redis.call('RPUSH', KEYS[tonumber(ARGV[3]) + 1], ARGV[5])
end
wake_one(KEYS[13])
return 1
