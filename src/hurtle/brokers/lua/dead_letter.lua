--[[
  Move a held delivery to its queue's dead letters, keeping its bytes exactly and the reason.

  Input:
    KEYS[1]      in-flight index of the worker (batch id -> count held)
    KEYS[2]      dead zset (id scored by failure time)
    KEYS[3]      dead raw hash (id -> payload)
    KEYS[4]      dead reason hash (id -> reason)

    ARGV[1]      batch id of the held delivery
    ARGV[2]      its index in the batch
    ARGV[3]      new dead-letter id
    ARGV[4]      reason
    ARGV[5]      payload, as it was delivered

  Output:
    1 if the delivery was still held and is now a dead letter; 0 if it had been settled already
    or recovered from this worker (declared dead): then nothing is stored, the copy that went
    back to the queue is the one that lives.
]]
-- @include _lib

if settle(KEYS[1], ARGV[1], tonumber(ARGV[2])) == 0 then
  return 0
end
redis.call('ZADD', KEYS[2], server_now(), ARGV[3])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[5])
redis.call('HSET', KEYS[4], ARGV[3], ARGV[4])
return 1
