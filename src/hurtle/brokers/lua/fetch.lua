--[[
  Take up to N messages for one worker: promote due delayed messages, pop from the ready lists
  highest priority first (FIFO within one), record them as in-flight batches of this worker
  (one list per priority: a few commands per batch, none per message) and refresh the worker's
  heartbeat.

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     delayed zset
    KEYS[12]     in-flight index of this worker (batch id -> count held); each batch's
                 payloads go to the list KEYS[12] .. ':' .. batch id
    KEYS[13]     workers zset
    KEYS[14]     wake list
    KEYS[15]     seq counter

    ARGV[1]      max count N (below 2^20)
    ARGV[2]      worker id
    ARGV[3]      at most this many due delayed messages are promoted per call
    ARGV[4]      the worker's heartbeat timeout in seconds: its deadline becomes now + this

  Output:
    { wait_ms, batch1, { payloads of batch1 }, batch2, { payloads of batch2 }, ... }
    (one batch per priority taken; message i of a batch, from 0, has receipt batch << 20 | i)
    wait_ms: when nothing was taken, milliseconds until the next delayed message is due
             (-1: none is delayed); 0 otherwise.

  Wake-up list upkeep: when the queue ran dry the tokens are stale and deleted; when this call
  took a full batch and more is ready, a token is left so another idle consumer wakes up.
]]
-- @include _lib

local now = server_now()
local want = tonumber(ARGV[1])

local due = redis.call('ZRANGEBYSCORE', KEYS[11], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
if #due > 0 then
  local groups = {}
  for _, member in ipairs(due) do
    local p = string.byte(member, 1) - 48
    local sep = string.find(member, ':', 3, true)
    local g = groups[p]
    if not g then
      g = {}
      groups[p] = g
    end
    g[#g + 1] = string.sub(member, sep + 1)
  end
  for p, g in pairs(groups) do
    call_chunked('RPUSH', KEYS[p + 1], g)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[11], 0, #due - 1)
end

local out = { 0 }
local got = 0
for p = 9, 0, -1 do
  local items = redis.call('LPOP', KEYS[p + 1], want - got)
  if items then
    local n = #items
    local batch = string.format('%d', redis.call('INCR', KEYS[15]) * 10 + p)
    call_chunked('RPUSH', KEYS[12] .. ':' .. batch, items)
    redis.call('HSET', KEYS[12], batch, n)
    out[#out + 1] = tonumber(batch)
    out[#out + 1] = items
    got = got + n
    if got >= want then
      break
    end
  end
end

redis.call('ZADD', KEYS[13], now + tonumber(ARGV[4]), ARGV[2])

if got < want then
  redis.call('DEL', KEYS[14])
elseif redis.call('EXISTS', unpack(KEYS, 1, 10)) > 0 then
  wake_one(KEYS[14])
end

if got == 0 then
  local first = redis.call('ZRANGE', KEYS[11], 0, 0, 'WITHSCORES')
  if first[2] then
    out[1] = math.max(0, math.ceil((tonumber(first[2]) - now) * 1000))
  else
    out[1] = -1
  end
end
return out
