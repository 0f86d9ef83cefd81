--[[
  Acknowledge a batch of workflow members, each together with everything it sets off, in one
  call: for each step what ack_flow.lua does for one (store its records, publish the next
  link(s), count it in its chord and publish the chord's callback when it completes the count,
  once, drop a chord record it is done with), all of it atomic as a script is. A step whose
  delivery the worker no longer holds (settled, recovered) does nothing: the copy delivered
  again sets it off instead. The keys are named once each and the steps refer to them by
  position, and a chord's callback, the same for all its members, is passed once. The steps of
  one fetched batch are settled together, and a chord's count is read once per call.

  Input:
    KEYS[1]      the set of known queues
    KEYS[2..]    every other key the steps touch, once each: in-flight indexes, result hashes,
                 chord hashes, and 13 keys in a row per queue published to (ready lists 0..9,
                 delayed zset, wake list, seq counter)
    ARGV[1]      the channel that announces results
    ARGV[2]      how many steps, ARGV[3] how many callbacks
    ARGV[4..]    per callback: the position of its queue's first key, its queue, priority, eta
                 (0: ready now), payload (5 arguments each)
    then per step: six little-endian uint32s packed in one string (the position of its in-flight
                 index, its index in the batch, how many results, how many messages to publish,
                 1 with a chord, the position of the chord hash to drop, 0: none), its batch id,
                 the results' ids (space-separated); per result: the position of its hash, id,
                 payload, ttl in ms; per published message: the position of its queue's first
                 key, queue, priority, eta, payload; with a chord: four uint32s packed (the
                 position of its hash, member index, member count, its callback's number from 1),
                 member payload, ttl in ms

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

-- The steps, read first: where each one's arguments start, and its fields.
local steps = {}
local a = 4 + 5 * ncallbacks
for s = 1, nsteps do
  local inflight, index, nres, npub, chord, forget = struct.unpack('<I4I4I4I4I4I4', ARGV[a])
  steps[s] = { a = a + 3, inflight = inflight, batch = ARGV[a + 1], index = index, nres = nres,
    npub = npub, chord = chord, forget = forget, ids = ARGV[a + 2] }
  a = a + 3 + 4 * nres + 5 * npub + 3 * chord
end

-- Which deliveries are still held, settling them: one HGET, BITFIELD and HINCRBY per run of
-- steps of one fetched batch (as ack.lua's groups), where settle() would cost three per step.
local held = {}
local s = 1
while s <= nsteps do
  local first = steps[s]
  local index, batch = KEYS[first.inflight], first.batch
  local e = s
  while e < nsteps and steps[e + 1].inflight == first.inflight and steps[e + 1].batch == batch do
    e = e + 1
  end
  local left = tonumber(redis.call('HGET', index, batch))
  if left then
    local indexes = {}
    for j = s, e do
      indexes[j - s + 1] = steps[j].index
    end
    mark_settled(index, batch, left, indexes, held, s)
  end
  s = e + 1
end

-- What each held step sets off; a chord's count is read once per call, after its members.
local done = 0
local chords, order = {}, {}
for s2 = 1, nsteps do
  if held[s2] then
    done = done + 1
    local step = steps[s2]
    a = step.a
    for _ = 1, step.nres do  -- as redis/results.py stores them: a field of the bucket's hash
      local key, ttl = KEYS[tonumber(ARGV[a])], tonumber(ARGV[a + 3])
      redis.call('HSET', key, ARGV[a + 1], string.format('%013d', now_ms + ttl) .. ARGV[a + 2])
      if redis.call('PTTL', key) < ttl then
        redis.call('PEXPIRE', key, ttl)
      end
      a = a + 4
    end
    if step.nres > 0 then
      redis.call('PUBLISH', ARGV[1], step.ids)
    end
    for _ = 1, step.npub do
      put(tonumber(ARGV[a]), ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
      a = a + 5
    end
    if step.chord == 1 then
      local pos, member, total, callback = struct.unpack('<I4I4I4I4', ARGV[a])
      local fresh = redis.call('HSETNX', KEYS[pos], member, ARGV[a + 1])
      local seen = chords[pos]
      if not seen then
        seen = { ttl = ARGV[a + 2], total = total, callback = callback, fresh = 0 }
        chords[pos] = seen
        order[#order + 1] = pos
      end
      seen.fresh = seen.fresh + fresh
    end
    if step.forget > 0 then
      redis.call('DEL', KEYS[step.forget])
    end
  end
end
for _, pos in ipairs(order) do
  local seen = chords[pos]
  local key = KEYS[pos]
  redis.call('PEXPIRE', key, seen.ttl)
  -- member fields are '0'..total-1; 'fired' joins them once the callback is out, so the count
  -- reaches total exactly once, in the call that counts the last member
  if seen.fresh > 0 and redis.call('HLEN', key) == seen.total then
    redis.call('HSET', key, 'fired', '1')
    local b = 4 + 5 * (seen.callback - 1)
    put(tonumber(ARGV[b]), ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4])
  end
end
return done
