--[[
  Acknowledge a batch of workflow members, each together with everything it sets off, in one
  call: for each step what ack_flow.lua does for one (store its records, publish the next
  link(s), count it in its chord and publish the chord's callback when it completes the count,
  once, drop a chord record it is done with), all of it atomic as a script is. A step whose
  delivery the worker no longer holds (settled, recovered) does nothing: the copy delivered
  again sets it off instead. The keys are named once each and the steps refer to them by
  position, and a chord's callback, the same for all its members, is passed once.

  Input:
    KEYS[1]      the set of known queues
    KEYS[2..]    every other key the steps touch, once each: in-flight indexes, result hashes,
                 chord hashes, and 13 keys in a row per queue published to (ready lists 0..9,
                 delayed zset, wake list, seq counter)
    ARGV[1]      the channel that announces results
    ARGV[2]      how many steps, ARGV[3] how many callbacks
    ARGV[4..]    per callback: the position of its queue's first key, its queue, priority, eta
                 (0: ready now), payload (5 arguments each)
    then per step: the position of its in-flight index, its batch id, its index in the batch,
                 how many results, how many messages to publish, 1 with a chord, the position
                 of the chord hash to drop (0: none), the results' ids (space-separated); per
                 result: the position of its hash, id, payload, ttl in ms; per published
                 message: the position of its queue's first key, queue, priority, eta, payload;
                 with a chord: the position of its hash, member index, member count, member
                 payload, ttl in ms, its callback's number (from 1)

  Output:
    how many steps happened (their deliveries were held)
]]
-- @include _lib

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

-- Store one message as publish.lua does: ready at the tail of its priority, or delayed.
local function put(first, queue, priority, eta, payload)
  local p = tonumber(priority)
  redis.call('SADD', KEYS[1], queue)
  eta = tonumber(eta)
  if eta > 0 and eta > now then
    local seq = redis.call('INCR', KEYS[first + 12])
    redis.call('ZADD', KEYS[first + 10], eta, priority .. string.format(':%012x:', seq) .. payload)
  else
    redis.call('RPUSH', KEYS[first + p], payload)
  end
  redis.call('RPUSH', KEYS[first + 11], '1')
  redis.call('LTRIM', KEYS[first + 11], -MAX_TOKENS, -1)
end

local nsteps, ncallbacks = tonumber(ARGV[2]), tonumber(ARGV[3])
local a = 4 + 5 * ncallbacks
local done = 0
for _ = 1, nsteps do
  local nres, npub = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local chord, forget, ids = ARGV[a + 5], tonumber(ARGV[a + 6]), ARGV[a + 7]
  local held = settle(KEYS[tonumber(ARGV[a])], ARGV[a + 1], tonumber(ARGV[a + 2])) == 1
  a = a + 8
  if held then
    done = done + 1
    for _ = 1, nres do  -- as redis/results.py stores them: a field of the bucket's hash
      local key, ttl = KEYS[tonumber(ARGV[a])], tonumber(ARGV[a + 3])
      redis.call('HSET', key, ARGV[a + 1], string.format('%013d', now_ms + ttl) .. ARGV[a + 2])
      if redis.call('PTTL', key) < ttl then
        redis.call('PEXPIRE', key, ttl)
      end
      a = a + 4
    end
    if nres > 0 then
      redis.call('PUBLISH', ARGV[1], ids)
    end
    for _ = 1, npub do
      put(tonumber(ARGV[a]), ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
      a = a + 5
    end
    if chord == '1' then
      local key, total = KEYS[tonumber(ARGV[a])], tonumber(ARGV[a + 2])
      local fresh = redis.call('HSETNX', key, ARGV[a + 1], ARGV[a + 3])
      redis.call('PEXPIRE', key, ARGV[a + 4])
      -- member fields are '0'..total-1; 'fired' joins them once the callback is out, so the
      -- count reaches total exactly once, by the member that completes it
      if fresh == 1 and redis.call('HLEN', key) == total then
        redis.call('HSET', key, 'fired', '1')
        local c = 4 + 5 * (tonumber(ARGV[a + 5]) - 1)
        put(tonumber(ARGV[c]), ARGV[c + 1], ARGV[c + 2], ARGV[c + 3], ARGV[c + 4])
      end
      a = a + 6
    end
    if forget > 0 then
      redis.call('DEL', KEYS[forget])
    end
  else  -- skipped: its arguments are passed over
    a = a + 4 * nres + 5 * npub
    if chord == '1' then
      a = a + 6
    end
  end
end
return done
