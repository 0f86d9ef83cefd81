--[[
  Store a batch of task results, each with its expiry, and announce their ids.

  Run in the same pipeline as the acknowledgements, before them. Results are fields of hashes,
  one per run of ids that differ only in their last few bytes (keys.result_key), so a batch is
  one HSET (per CHUNK) and one expiry per hash touched, not a key and an expiry per result.
  Each value starts with the result's own expiry (13 digits, the server's milliseconds, put
  there by the caller), which result_get.lua checks; the hash expires when the last result
  written to it does. The batch comes in a few packed strings rather than two arguments per
  result, so that the caller packs a few strings, not thousands of arguments; the work per
  result here is two substrings and a prefix test. The keys are made here (a reader knows only
  the id). On a Redis Cluster (cluster.py) each call holds the ids of one hash, declared as
  KEYS[1] so that the call goes to its slot (the name made here is the same), and ARGV[1] is
  '': the caller announces the batch itself, on a sharded channel.

  Input:
    KEYS[1]      on a Redis Cluster only: the one hash of this call's ids

    ARGV[1]      the channel that announces results (keys.RESULTS_CHANNEL)
    ARGV[2]      the ids of the results, space-separated (the announcement)
    ARGV[3]      their time to live, in milliseconds (one call per distinct ttl)
    ARGV[4]      the result key of id X is ARGV[4] .. X less its last ARGV[5] bytes .. '}'
    ARGV[5]      keys.RESULT_BUCKET_CUT
    ARGV[6]      the ids, concatenated
    ARGV[7]      the values (13-digit expiry, then payload), concatenated
    ARGV[8]      per result, the lengths of its id and its payload (without the 13 digits):
                 two little-endian uint32s

  Output:
    how many results were stored
]]
-- @include _lib

local ttl = tonumber(ARGV[3])
local prefix = ARGV[4]
local cut = tonumber(ARGV[5])
local ids = ARGV[6]
local values = ARGV[7]
local lengths = ARGV[8]
local sub, find, unpack4 = string.sub, string.find, struct.unpack
local n = #lengths / 8
local buckets = {}  -- bucket -> { id, value, id, value, ... }
local order = {}
-- consecutive ids mostly share their bucket: the last one's, as an anchored pattern
local last_len, last_pattern, fields, k = -1, nil, nil, 0
local at_id, at_value, pos = 1, 1, 1
for _ = 1, n do
  local id_len, payload_len
  id_len, payload_len, pos = unpack4('<I4I4', lengths, pos)
  local bucket_len = math.max(id_len - cut, 0)
  -- the same bucket as the last id: a prefix test, no substring
  if not (bucket_len == last_len and find(ids, last_pattern, at_id)) then
    local bucket = sub(ids, at_id, at_id + bucket_len - 1)
    fields = buckets[bucket]
    if not fields then
      fields = {}
      buckets[bucket] = fields
      order[#order + 1] = bucket
    end
    last_len = bucket_len
    last_pattern = '^' .. string.gsub(string.gsub(bucket, '[%^%$%(%)%%%.%[%]%*%+%-%?]', '%%%0'), '%z', '%%z')
    k = #fields
  end
  local value_len = payload_len + 13
  fields[k + 1] = sub(ids, at_id, at_id + id_len - 1)
  fields[k + 2] = sub(values, at_value, at_value + value_len - 1)
  k = k + 2
  at_id = at_id + id_len
  at_value = at_value + value_len
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
