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
    KEYS[16]     this worker's fetch record: "token batch1 batch2 ..." of its last fetch that
                 took something
    KEYS[17]     dead zset (id scored by failure time)
    KEYS[18]     dead raw hash (id -> bytes)
    KEYS[19]     dead reason hash (id -> reason)
    KEYS[20]     paused flag: while it exists, nothing is promoted or taken
    KEYS[21]     cancels flag: whether some cancellation may be live (returned, not changed)
    KEYS[22]     replaced flag: whether a debounced call may have been replaced
                 (``latest_put.lua``; returned, not changed)
    KEYS[23]     (only from a worker that reads several queues) last probe (STRING: priority
                 digit .. payload), the last message heartbeat.lua let out of quarantine; it
                 exists only while that one may still be ready

    ARGV[1]      max count N (below 2^20)
    ARGV[2]      worker id
    ARGV[3]      at most this many due delayed messages are promoted per call
    ARGV[4]      fetch token: the worker sends a fetch again with the same token as long as it
                 has not read a reply to it (lost connection, restarted server)
    ARGV[5]      the worker's heartbeat timeout in seconds: its deadline becomes now + this

  Output:
    { wait_ms, cancels, batch1, { payloads of batch1 }, batch2, { payloads of batch2 }, ... }
    (one batch per priority taken; message i of a batch, from 0, has receipt batch << 20 | i)
    wait_ms: when nothing was taken, milliseconds until the next delayed message is due
             (-1: none is delayed, or the queue is paused); when something was, 1 if it holds
             the last probe (the worker then reads no other queue in this fetch, so that a
             fetch over several queues, or a sharded queue's shards, holds one probe at most:
             a message that kills its worker is blamed alone), else 0.
    cancels: 1 when the cancels flag exists (the worker then screens the batch), else 0;
             plus 2 when the replaced flag exists (the worker then reads the debounce records
             of the batch's calls).

  A fetch whose reply was lost: the batches it took are held by this worker, which never learnt
  their ids and would hold them until it stops. When the token is the one recorded, those batches
  (what of them is still held) go back to the front of their ready lists before the fetch takes
  again: sending a fetch twice takes its messages once.

  A delayed member that is not "<priority 0-9>:<hex sequence>:<payload>" (written by something
  other than hurtle) goes to the queue's dead letters as it was, with the reason, instead of
  failing every fetch of the queue.

  Wake-up list upkeep: when the queue ran dry the tokens are stale and deleted; when this call
  took a full batch and more is ready, a token is left so another idle consumer wakes up.
]]
-- @include _lib

-- A fetch record lives a week at most: a worker that died holding one leaves no key for good.
local RECORD_TTL_MS = 7 * 24 * 3600 * 1000

-- Put what worker index `index` still holds of batch `batch` back at the front of its ready list,
-- in order, and forget the batch.
local function hand_back(index, batch)
  if not redis.call('HGET', index, batch) then
    return  -- recovered from this worker meanwhile: already back
  end
  local key = index .. ':' .. batch
  local items = redis.call('LRANGE', key, 0, -1)
  local done = redis.call('GET', key .. ':done') or ''
  local back = {}
  for i = #items, 1, -1 do  -- LPUSH newest first leaves the oldest at the head
    local byte = string.byte(done, math.floor((i - 1) / 8) + 1) or 0
    if math.floor(byte / 2 ^ (7 - (i - 1) % 8)) % 2 == 0 then
      back[#back + 1] = items[i]
    end
  end
  call_chunked('LPUSH', KEYS[(tonumber(batch) % 10) + 1], back)
  drop_batch(index, batch)
end

local now = server_now()
local want = tonumber(ARGV[1])

local record = redis.call('GET', KEYS[16])
if record then
  local token, batches = string.match(record, '^(%S+) (.*)$')
  if token == ARGV[4] then
    for batch in string.gmatch(batches, '%d+') do
      hand_back(KEYS[12], batch)
    end
  end
end

local paused = redis.call('EXISTS', KEYS[20]) == 1
local due = {}
if not paused then
  due = redis.call('ZRANGEBYSCORE', KEYS[11], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
end
if #due > 0 then
  local groups = {}
  for _, member in ipairs(due) do
    local p, at = string.match(member, '^(%d):%x+:()')
    if p then
      p = tonumber(p)
      local g = groups[p]
      if not g then
        g = {}
        groups[p] = g
      end
      g[#g + 1] = string.sub(member, at)
    else
      local id = string.format('delayed-%012x', redis.call('INCR', KEYS[15]))
      redis.call('ZADD', KEYS[17], now, id)
      redis.call('HSET', KEYS[18], id, member)
      redis.call('HSET', KEYS[19], id, 'malformed member of the delayed set: expected ' ..
        '"<priority 0-9>:<hex sequence>:<message>"; kept here as it was found')
    end
  end
  for p, g in pairs(groups) do
    call_chunked('RPUSH', KEYS[p + 1], g)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[11], 0, #due - 1)
end

local out = { 0, redis.call('EXISTS', KEYS[21]) + 2 * redis.call('EXISTS', KEYS[22]) }
local got = 0
local taken = { ARGV[4] }
for p = 9, 0, -1 do
  if paused then
    break
  end
  local items = redis.call('LPOP', KEYS[p + 1], want - got)
  if items then
    local n = #items
    local batch = string.format('%d', redis.call('INCR', KEYS[15]) * 10 + p)
    call_chunked('RPUSH', KEYS[12] .. ':' .. batch, items)
    redis.call('HSET', KEYS[12], batch, n)
    out[#out + 1] = tonumber(batch)
    out[#out + 1] = items
    taken[#taken + 1] = batch
    got = got + n
    if got >= want then
      break
    end
  end
end
if got > 0 then
  redis.call('SET', KEYS[16], table.concat(taken, ' '), 'PX', RECORD_TTL_MS)
  local probe = KEYS[23] and redis.call('GET', KEYS[23])
  if probe then
    local p = string.byte(probe, 1) - 48
    local payload = string.sub(probe, 2)
    for at = 3, #out, 2 do
      if out[at] % 10 == p then
        for _, item in ipairs(out[at + 1]) do
          if item == payload then
            out[1] = 1
            break
          end
        end
      end
    end
  end
elseif record then
  redis.call('DEL', KEYS[16])
end

redis.call('ZADD', KEYS[13], now + tonumber(ARGV[5]), ARGV[2])

if got < want then
  redis.call('DEL', KEYS[14])
elseif redis.call('EXISTS', unpack(KEYS, 1, 10)) > 0 then
  wake_one(KEYS[14])
end

if got == 0 then
  local first = redis.call('ZRANGE', KEYS[11], 0, 0, 'WITHSCORES')
  if paused then
    out[1] = -1  -- woken by a publish or by the resume
  elseif first[2] then
    out[1] = math.max(0, math.ceil((tonumber(first[2]) - now) * 1000))
  else
    out[1] = -1
  end
end
return out
