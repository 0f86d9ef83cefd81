--[[
  Acknowledge one workflow member together with everything it sets off, atomically: store its
  records, publish the next link(s), count it in its chord (and publish the chord's callback
  when it completes the count, once), drop a chord record it is done with. Nothing happens
  unless the worker still holds the delivery (not settled, not recovered): the copy delivered
  again sets it off instead.

  Input:
    KEYS[1]      in-flight index of the worker (batch id -> count held)
    KEYS[2]      the set of known queues
    KEYS[3..]    the result hashes (keys.result_key, ARGV[3] of them); then 13 keys per published message (ready
                 lists 0..9, delayed zset, wake list, seq counter of its queue); then, with a
                 chord, the chord's hash and the 13 keys of its callback's queue; then, with
                 forget, the chord hash to drop

    ARGV[1]      batch id of the delivery
    ARGV[2]      its index in the batch
    ARGV[3]      how many results, ARGV[4] how many messages to publish, ARGV[5] 1 with a chord,
                 ARGV[6] 1 with a chord to forget
    ARGV[7]      the channel that announces results, ARGV[8] their ids, space-separated
    ARGV[9..]    per result: id, payload, ttl in ms; per published message: queue, priority, eta
                 (0: ready now), payload; with a chord: member index, member count, member
                 payload, ttl in ms, then the callback as a published message

  Output:
    1 when the delivery was held and all of it happened, 2 when this member also completed the
    chord (its callback was published), 0 when nothing happened
]]
-- @include _lib

if settle(KEYS[1], ARGV[1], tonumber(ARGV[2])) == 0 then
  return 0
end

local nres, npub = tonumber(ARGV[3]), tonumber(ARGV[4])
local k, a = 3, 9

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _ = 1, nres do  -- as redis/results.py stores them: a field of the bucket's hash, after its expiry
  local ttl = tonumber(ARGV[a + 2])
  redis.call('HSET', KEYS[k], ARGV[a], string.format('%013d', now_ms + ttl) .. ARGV[a + 1])
  if redis.call('PTTL', KEYS[k]) < ttl then
    redis.call('PEXPIRE', KEYS[k], ttl)
  end
  k, a = k + 1, a + 3
end
if nres > 0 then
  redis.call('PUBLISH', ARGV[7], ARGV[8])
end

-- Store one message as publish.lua does: ready at the tail of its priority, or delayed.
local function put(key, arg)
  local queue, p, eta, payload = ARGV[arg], tonumber(ARGV[arg + 1]), tonumber(ARGV[arg + 2]),
    ARGV[arg + 3]
  redis.call('SADD', KEYS[2], queue)
  if eta > 0 and eta > server_now() then
    local seq = redis.call('INCR', KEYS[key + 12])
    redis.call('ZADD', KEYS[key + 10], eta, ARGV[arg + 1] .. string.format(':%012x:', seq) .. payload)
  else
    redis.call('RPUSH', KEYS[key + p], payload)
  end
  redis.call('RPUSH', KEYS[key + 11], '1')
  redis.call('LTRIM', KEYS[key + 11], -MAX_TOKENS, -1)
end

for _ = 1, npub do
  put(k, a)
  k, a = k + 13, a + 4
end

local out = 1
if ARGV[5] == '1' then
  local chord = KEYS[k]
  local index, total, ttl = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 3]
  local fresh = redis.call('HSETNX', chord, index, ARGV[a + 2])
  redis.call('PEXPIRE', chord, ttl)
  -- member fields are '0'..total-1; 'fired' joins them once the callback is out, so the count
  -- reaches total exactly once, by the member that completes it
  if fresh == 1 and redis.call('HLEN', chord) == total then
    redis.call('HSET', chord, 'fired', '1')
    put(k + 1, a + 4)
    out = 2
  end
  k = k + 14
end
if ARGV[6] == '1' then
  redis.call('DEL', KEYS[k])
end
return out
