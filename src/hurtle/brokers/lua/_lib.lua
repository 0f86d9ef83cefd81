-- Helpers shared by hurtle's scripts; spliced in where a script says "-- @include _lib".
-- Not a script on its own. Every helper takes its keys as arguments.
--
-- Conventions shared by all scripts (see hurtle/brokers/keys.py):
--   * ready lists are KEYS[1..10], KEYS[p + 1] holding priority p; head = next to run;
--   * a worker's in-flight record is an index hash (batch id B -> how many it still holds), and
--     per batch a list of payloads (index .. ':' .. B) and a bitmap of settled ones (.. ':done');
--     B = SEQ * 10 + priority, so a batch says where its messages go back;
--   * time is the server's (TIME), in seconds, so every host agrees on heartbeats and etas;
--   * every key a script touches is in its KEYS, or is derived from one of them by appending
--     to its name: the batch keys (their ids are made by the fetch script, or read from the
--     index) and the indexes of other workers (found in a workers zset, from the declared
--     in-flight prefix). The hash tag {queue} comes first in every name, so a suffix never
--     changes the slot: a Redis Cluster routes the script by its declared keys to the node
--     that owns that slot, where the derived keys live too (Redis allows a script keys of the
--     slot it was routed by, declared or not).

-- Lua's unpack() is limited by the C stack; commands with many values go in chunks of this size
-- (even, so that field/value pairs are never split).
local CHUNK = 4000
-- At most this many wake-up tokens wait in a queue's wake list.
local MAX_TOKENS = 8

local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- Run `cmd key v1 v2 ...` over `values`, CHUNK values per call.
local function call_chunked(cmd, key, values)
  local n = #values
  local i = 1
  while i <= n do
    local j = math.min(i + CHUNK - 1, n)
    redis.call(cmd, key, unpack(values, i, j))
    i = j + 1
  end
end

-- Make sure at least one idle consumer wakes up: push a token unless one is already waiting.
local function wake_one(wake)
  if redis.call('LLEN', wake) == 0 then
    redis.call('RPUSH', wake, '1')
  end
end

-- Wake idle consumers after a publish of `ready` ready and `delayed` delayed messages: one token
-- per ready message (up to MAX_TOKENS) wakes that many at once; a token for delayed messages lets
-- a sleeping consumer learn the new earliest eta.
local function wake_for(wake, ready, delayed)
  local tokens = math.min(ready, MAX_TOKENS)
  if tokens == 0 and delayed > 0 then
    tokens = 1
  end
  if tokens > 0 then
    local t = {}
    for i = 1, tokens do
      t[i] = '1'
    end
    redis.call('RPUSH', wake, unpack(t))
    redis.call('LTRIM', wake, -MAX_TOKENS, -1)
  end
end

-- The values of `fields[1..n]` of hash `key` (false where missing), in order, CHUNK fields per
-- HMGET.
local function hmget_chunked(key, fields, n)
  local values = {}
  local i = 1
  while i <= n do
    local j = math.min(i + CHUNK - 1, n)
    local got = redis.call('HMGET', key, unpack(fields, i, j))
    for k = 1, j - i + 1 do
      values[i + k - 1] = got[k]
    end
    i = j + 1
  end
  return values
end

-- Forget batch `batch` of the in-flight index `index`: its payloads, bitmap and index entry.
local function drop_batch(index, batch)
  local key = index .. ':' .. batch
  redis.call('DEL', key, key .. ':done')
  redis.call('HDEL', index, batch)
end

-- Mark messages `indexes` of batch `batch` of the in-flight index `index` (`left` of them still
-- held) settled in the batch's bitmap (BITFIELD, CHUNK arguments a call), and drop the batch once
-- none is left held. Returns how many were held until now; with a table `held`, also sets
-- held[at + n - 1] for each indexes[n] that was.
local function mark_settled(index, batch, left, indexes, held, at)
  local ops = {}
  for n, i in ipairs(indexes) do
    ops[4 * n - 3], ops[4 * n - 2], ops[4 * n - 1], ops[4 * n] = 'SET', 'u1', i, 1
  end
  local fresh = 0
  local n = 0
  local j = 1
  while j <= #ops do
    local last = math.min(j + CHUNK - 1, #ops)  -- CHUNK is a multiple of 4: whole operations
    for _, old in ipairs(redis.call('BITFIELD', index .. ':' .. batch .. ':done',
        unpack(ops, j, last))) do
      if old == 0 then
        fresh = fresh + 1
        if held then
          held[at + n] = true
        end
      end
      n = n + 1
    end
    j = last + 1
  end
  if fresh >= left then
    drop_batch(index, batch)
  elseif fresh > 0 then
    redis.call('HINCRBY', index, batch, -fresh)
  end
  return fresh
end

-- Acknowledge deliveries of the in-flight index `index` (ack.lua, ack_results.lua): ARGV[from] to
-- ARGV[to] are groups of three, a batch id, k, and the k message indexes of that batch as
-- little-endian uint32s packed in one string (distinct, ascending). Returns how many deliveries
-- were held until now.
--
-- The common case costs no work per message: when the acknowledgement covers every message of a
-- batch that is still held and none of it was settled before, the batch is simply deleted.
-- Otherwise each message is marked in the batch's bitmap (BITFIELD, one call per batch), so that
-- a message acknowledged twice counts once and recovery skips what was settled.
local function ack_groups(index, from, to)
  local settled = 0
  for g = from, to, 3 do
    local batch = ARGV[g]
    local k = tonumber(ARGV[g + 1])
    local left = tonumber(redis.call('HGET', index, batch))
    if left then
      local key = index .. ':' .. batch
      if k == left and redis.call('EXISTS', key .. ':done') == 0 then
        drop_batch(index, batch)
        settled = settled + k
      else
        local packed = ARGV[g + 2]
        local indexes = {}
        local pos = 1
        for n = 1, k do
          indexes[n], pos = struct.unpack('<I4', packed, pos)
        end
        settled = settled + mark_settled(index, batch, left, indexes)
      end
    end
  end
  return settled
end

-- Mark message `i` of a held batch settled. Returns 1 if it was held until now, 0 if it was
-- settled before or the batch is gone (recovered from a worker declared dead).
local function settle(index, batch, i)
  local left = redis.call('HGET', index, batch)
  if not left then
    return 0
  end
  if redis.call('SETBIT', index .. ':' .. batch .. ':done', i, 1) == 1 then
    return 0
  end
  if tonumber(left) <= 1 then
    drop_batch(index, batch)
  else
    redis.call('HINCRBY', index, batch, -1)
  end
  return 1
end

-- Take every unsettled message out of the in-flight index `index` and delete the whole record.
-- Returns { {priority, payload}, ... }, oldest first.
local function take_unsettled(index)
  local flat = redis.call('HGETALL', index)
  if #flat == 0 then
    return {}
  end
  local batches = {}
  for i = 1, #flat, 2 do
    batches[#batches + 1] = tonumber(flat[i])
  end
  table.sort(batches)
  local out = {}
  for _, batch in ipairs(batches) do
    local key = index .. ':' .. string.format('%d', batch)
    local items = redis.call('LRANGE', key, 0, -1)
    local done = redis.call('GET', key .. ':done') or ''
    local p = batch % 10
    for i = 1, #items do
      local byte = string.byte(done, math.floor((i - 1) / 8) + 1) or 0
      local bit = math.floor(byte / 2 ^ (7 - (i - 1) % 8)) % 2
      if bit == 0 then
        out[#out + 1] = { p, items[i] }
      end
    end
    redis.call('DEL', key, key .. ':done')
  end
  redis.call('DEL', index)
  return out
end

-- Put `items` ({priority, payload}, oldest first) at the front of their ready lists, keeping
-- their order: the oldest ends up at the head.
local function push_front(items, ready)
  local back = {}  -- priority -> payloads, newest first
  for i = #items, 1, -1 do
    local p = items[i][1]
    local list = back[p]
    if not list then
      list = {}
      back[p] = list
    end
    list[#list + 1] = items[i][2]
  end
  for p, list in pairs(back) do
    -- LPUSH k a b c leaves c b a: pushing newest first puts the oldest at the head.
    call_chunked('LPUSH', ready[p + 1], list)
  end
end

-- Put every unsettled message of the in-flight index `index` back at the front of its ready
-- list, oldest first, and delete the whole record. Returns how many messages went back.
local function requeue_all(index, ready)
  local items = take_unsettled(index)
  push_front(items, ready)
  return #items
end

-- The index of dead letters by message id (keys.DEAD_INDEX, a hash: message id -> queue ..
-- '\31' .. dead-letter id), kept in the same step as the dead letters it names. Its key has
-- a slot of its own: on a Redis Cluster (index = '') a script cannot write it, and appends
-- what it would have done to `changes` ('+' or '-', message id, entry), which the caller
-- applies with dead_index.lua.

-- The id of the message in `payload` (msgpack, its first field), or nil.
local function dead_message_id(payload)
  local ok, m = pcall(cmsgpack.unpack, payload)
  if ok and type(m) == 'table' and type(m[1]) == 'string' and m[1] ~= '' then
    return m[1]
  end
  return nil
end

local function index_dead(index, changes, message_id, queue, id)
  if not message_id or message_id == '' then
    return
  end
  local entry = queue .. '\31' .. id
  if index == '' then
    changes[#changes + 1] = '+'
    changes[#changes + 1] = message_id
    changes[#changes + 1] = entry
  else
    redis.call('HSET', index, message_id, entry)
  end
end

-- Forget the entries of the dead letters `ids` of `queue` (their payloads in `raw`, read before
-- they go), each only while it names that dead letter: a later dead letter of the same message
-- keeps its own.
local function unindex_dead(index, changes, raw, queue, ids)
  for _, id in ipairs(ids) do
    local payload = redis.call('HGET', raw, id)
    local message_id = payload and dead_message_id(payload)
    if message_id then
      local entry = queue .. '\31' .. id
      if index == '' then
        changes[#changes + 1] = '-'
        changes[#changes + 1] = message_id
        changes[#changes + 1] = entry
      elseif redis.call('HGET', index, message_id) == entry then
        redis.call('HDEL', index, message_id)
      end
    end
  end
end

-- Delete the dead letters `ids` of `queue` (zset `dead`, hashes `raw` and `reasons`) with their
-- index entries (unindex_dead), CHUNK ids per command; returns how many of them there were.
local function drop_dead(index, changes, dead, raw, reasons, queue, ids)
  unindex_dead(index, changes, raw, queue, ids)
  local n = 0
  local i = 1
  while i <= #ids do
    local j = math.min(i + CHUNK - 1, #ids)
    n = n + redis.call('ZREM', dead, unpack(ids, i, j))
    redis.call('HDEL', raw, unpack(ids, i, j))
    redis.call('HDEL', reasons, unpack(ids, i, j))
    i = j + 1
  end
  return n
end
