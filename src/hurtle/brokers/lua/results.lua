--[[
  Store a batch of task results, each with its expiry, and announce their ids.

  Run in the same pipeline as the acknowledgements, before them. Results are fields of hashes,
  one per run of ids that differ only in their last few bytes (keys.result_key), so a batch is
  one HSET (per CHUNK) and one expiry per hash touched, not a key and an expiry per result.
  Each value starts with the result's own expiry (13 digits, server milliseconds), which
  result_get.lua checks; the hash expires when the last result written to it does. The batch
  comes in a few packed strings rather than two arguments per result, so that neither the
  client nor the server handles thousands of arguments. The keys are made here (a reader knows
  only the id). On a Redis Cluster (cluster.py) each call holds the ids of one hash, declared
  as KEYS[1] so that the call goes to its slot (the name made here is the same), and ARGV[1] is
  '': the caller announces the batch itself, on a sharded channel.

  Input:
    KEYS[1]      on a Redis Cluster only: the one hash of this call's ids

    ARGV[1]      the channel that announces results (keys.RESULTS_CHANNEL)
    ARGV[2]      the ids of the results, space-separated (the announcement)
    ARGV[3]      their time to live, in milliseconds (one call per distinct ttl)
    ARGV[4]      the result key of id X is ARGV[4] .. X less its last ARGV[5] bytes .. '}'
    ARGV[5]      keys.RESULT_BUCKET_CUT
    ARGV[6]      the ids, concatenated
    ARGV[7]      the payloads, concatenated
    ARGV[8]      per result, the lengths of its id and its payload: two little-endian uint32s

  Output:
    how many results were stored
]]
-- @include _lib

local ttl = tonumber(ARGV[3])
local prefix = ARGV[4]
local cut = tonumber(ARGV[5])
local ids = ARGV[6]
local payloads = ARGV[7]
local lengths = ARGV[8]
local t = redis.call('TIME')
local stamp = string.format('%013d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + ttl)
local n = #lengths / 8
local buckets = {}  -- bucket -> { id, value, id, value, ... }
local order = {}
local last, fields, k = nil, nil, 0  -- consecutive ids mostly share their bucket
local at_id, at_payload, pos = 1, 1, 1
for _ = 1, n do
  local id_len, payload_len
  id_len, payload_len, pos = struct.unpack('<I4I4', lengths, pos)
  local bucket = string.sub(ids, at_id, at_id + math.max(id_len - cut, 0) - 1)
  if bucket ~= last then
    fields = buckets[bucket]
    if not fields then
      fields = {}
      buckets[bucket] = fields
      order[#order + 1] = bucket
    end
    last = bucket
    k = #fields
  end
  fields[k + 1] = string.sub(ids, at_id, at_id + id_len - 1)
  fields[k + 2] = stamp .. string.sub(payloads, at_payload, at_payload + payload_len - 1)
  k = k + 2
  at_id = at_id + id_len
  at_payload = at_payload + payload_len
end
for _, bucket in ipairs(order) do
  local key = prefix .. bucket .. '}'
  call_chunked('HSET', key, buckets[bucket])
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end
if ARGV[1] ~= '' then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return n
