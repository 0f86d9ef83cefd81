--[[
  Acknowledge deliveries of one worker together with their records, in one step: a record is
  written only if the batch that delivered its message is still held by the worker, read before
  the acknowledgements drop it. A worker taken for dead meanwhile lost its whole in-flight
  record to recovery, so its late records are not written: the copies delivered again store
  their own. (A batch still held but some of whose messages this worker settled already has
  their records written again: its own outcomes, written before, when it retries a flush.)

  One server only (redis/settling.py): the result hashes are of other hash tags than the queue's.
  The records come as they would in plain HSETs (redis/results.py: values led by their 13-digit
  expiry), grouped in writes of one hash and one delivering batch; each hash gets the expiry
  results_expire.lua would give it.

  Input:
    KEYS[1]      in-flight index of the worker (batch id -> count held)
    KEYS[1 + j]  the hash of write j

    ARGV[1]      g, the number of acknowledged batches; then 3g arguments as ack.lua takes them
    ARGV[2 + 3g] the channel that announces results, ARGV[3 + 3g] the ids it announces
    ARGV[4 + 3g] w, the number of writes; then per write: the id of the batch its records
                 depend on, the longest time to live of its records in ms, its count of fields
    then         per write, its fields and values (2 per field)

  Output:
    how many deliveries were held until now
]]
-- @include _lib

local index = KEYS[1]
local g = tonumber(ARGV[1])
local at = 4 + 3 * g
local w = tonumber(ARGV[at])
local held = {}
for j = 1, w do
  local batch = ARGV[at + 3 * j - 2]
  if held[batch] == nil then
    held[batch] = redis.call('HEXISTS', index, batch) == 1
  end
end

local settled = ack_groups(index, 2, 1 + 3 * g)

local body = at + 3 * w + 1
local wrote = 0
for j = 1, w do
  local count = tonumber(ARGV[at + 3 * j])
  if held[ARGV[at + 3 * j - 2]] then
    local key = KEYS[1 + j]
    local last = body + 2 * count - 1
    local i = body
    while i <= last do
      local k = math.min(i + CHUNK - 1, last)
      redis.call('HSET', key, unpack(ARGV, i, k))
      i = k + 1
    end
    local ttl = tonumber(ARGV[at + 3 * j - 1])
    if redis.call('PTTL', key) < ttl then
      redis.call('PEXPIRE', key, ttl)
    end
    wrote = wrote + count
  end
  body = body + 2 * count
end
if wrote > 0 then
  redis.call('PUBLISH', ARGV[2 + 3 * g], ARGV[3 + 3 * g])
end
return settled
