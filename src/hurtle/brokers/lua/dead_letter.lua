--[[
  Move a held delivery to its queue's dead letters, keeping its bytes exactly and the reason.

  Input:
    KEYS[1]      in-flight hash of the worker
    KEYS[2]      dead zset (id scored by failure time)
    KEYS[3]      dead raw hash (id -> payload)
    KEYS[4]      dead reason hash (id -> reason)

    ARGV[1]      receipt of the held delivery
    ARGV[2]      new dead-letter id
    ARGV[3]      reason
    ARGV[4]      payload, as it was delivered

  Output:
    1 if the delivery was still held, 0 if it had been recovered from this worker meanwhile
    (the dead letter is stored either way).
]]
-- @include _lib

local held = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], server_now(), ARGV[2])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
redis.call('HSET', KEYS[4], ARGV[2], ARGV[3])
return held
