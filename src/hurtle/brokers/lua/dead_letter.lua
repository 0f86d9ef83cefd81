--[[
  Move a held delivery to its queue's dead letters, keeping its bytes exactly and the reason;
  then drop the queue's dead letters older than the ttl, and the oldest beyond the cap.

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
    ARGV[6]      seconds a dead letter is kept, 0 for no limit
    ARGV[7]      most dead letters kept, 0 for no limit
    ARGV[8]      the index of dead letters by message id, '' on a Redis Cluster (_lib.lua)
    ARGV[9]      the message's id, '' when the payload is not a message
    ARGV[10]     the queue's name

  Output:
    { held, expired, dropped, index changes (ARGV[8] = '' only)... }: held is 1 if the
    delivery was still held and is now a dead
    letter; 0 if it had been settled already or recovered from this worker (declared dead):
    then nothing is stored (the copy that went back to the queue is the one that lives) and
    nothing is trimmed. expired and dropped count the dead letters removed by the ttl and by
    the cap. One call removes at most TRIM_MAX of each, so that a backlog far above the cap
    (after lowering it) shrinks over several calls instead of blocking the server.
]]
-- @include _lib

if settle(KEYS[1], ARGV[1], tonumber(ARGV[2])) == 0 then
  return { 0, 0, 0 }
end
redis.call('ZADD', KEYS[2], server_now(), ARGV[3])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[5])
redis.call('HSET', KEYS[4], ARGV[3], ARGV[4])
local changes = {}
index_dead(ARGV[8], changes, ARGV[9], ARGV[10], ARGV[3])

-- trimming
local TRIM_MAX = 10000

local function drop(ids)
  if #ids > 0 then
    drop_dead(ARGV[8], changes, KEYS[2], KEYS[3], KEYS[4], ARGV[10], ids)
  end
  return #ids
end

local ttl = tonumber(ARGV[6])
local cap = tonumber(ARGV[7])
local expired = 0
local dropped = 0
if ttl > 0 then
  local cutoff = string.format('(%.6f', server_now() - ttl)
  expired = drop(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cutoff, 'LIMIT', 0, TRIM_MAX))
end
if cap > 0 then
  local excess = redis.call('ZCARD', KEYS[2]) - cap
  if excess > 0 then
    dropped = drop(redis.call('ZRANGE', KEYS[2], 0, math.min(excess, TRIM_MAX) - 1))
  end
end
local out = { 1, expired, dropped }
for i = 1, #changes do
  out[#out + 1] = changes[i]
end
return out
