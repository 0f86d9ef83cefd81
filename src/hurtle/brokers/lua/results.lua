--[[
  Store a batch of task results, each with its expiry, and announce their ids.

  Run in the same pipeline as the acknowledgements, before them: one command per batch rather
  than one SET per result. The batch comes in a few packed strings rather than two arguments
  per result, so that neither the client nor the server handles thousands of arguments. The
  keys are made here (each has its own hash tag, since a reader knows only the id): on a Redis
  Cluster this script would have to be split by slot.

  Input:
    ARGV[1]      the channel that announces results (keys.RESULTS_CHANNEL)
    ARGV[2]      the ids of the results, space-separated (the announcement)
    ARGV[3]      their time to live, in milliseconds (one call per distinct ttl)
    ARGV[4]      the result key of id X is ARGV[4] .. X .. '}' (keys.result_key)
    ARGV[5]      the ids, concatenated
    ARGV[6]      the payloads, concatenated
    ARGV[7]      per result, the lengths of its id and its payload: two little-endian uint32s

  Output:
    how many results were stored
]]

local ttl = ARGV[3]
local prefix = ARGV[4]
local ids = ARGV[5]
local payloads = ARGV[6]
local lengths = ARGV[7]
local n = #lengths / 8
local at_id, at_payload, pos = 1, 1, 1
for _ = 1, n do
  local id_len, payload_len
  id_len, payload_len, pos = struct.unpack('<I4I4', lengths, pos)
  local id = string.sub(ids, at_id, at_id + id_len - 1)
  redis.call('SET', prefix .. id .. '}', string.sub(payloads, at_payload, at_payload + payload_len - 1),
    'PX', ttl)
  at_id = at_id + id_len
  at_payload = at_payload + payload_len
end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return n
