--[[
  Record a worker's heartbeat in one queue, then recover that queue from dead workers: whatever a
  worker held whose deadline passed goes back to the queue.

  A worker's deadline is set by the worker itself (server time of its last beat or fetch plus its
  own heartbeat timeout), so workers with different timeouts judge each other fairly: a peer with
  a short timeout never takes what a live worker with a long one holds.

  Only the in-flight records matter here: delayed messages wait in the delayed zset whatever
  happens to workers, and a live worker's deliveries are never touched, however old.

  Poison messages (a task that kills its process). Every recovered message gets a death counted
  in the deaths zset (sha1 of its bytes -> deaths). One that dies for the first time goes back to
  the front of its ready list, like before. One that was recovered before goes to quarantine
  instead, out of the batches of innocent messages it came back with again and again; this script
  lets quarantined messages out one at a time (a "probe", at the front of its ready list; the next
  one once the previous probe was fetched). A message that comes back from a dead worker that
  held nothing else, or a probe that comes back from one that held no other probe, was the likely
  killer: past max_recoveries deaths it becomes a dead letter ("its worker died N times while
  holding it"), else it goes (back) to quarantine. Innocents of a recovered batch only ever wait
  in quarantine; they are never dead-lettered by this script, with one exception: a script sees
  one queue, so a worker reading several queues that dies holding one message (or probe) of each
  (the killer and an innocent) counts a death for both. The deaths zset keeps at most MAX_DEATHS
  entries (those with the fewest deaths go first). A message dead-lettered here ends what waits
  on it (end_lost): its records, its workflow's, its unique lock.

  Input:
    KEYS[1..10]  ready lists, priority 0..9
    KEYS[11]     workers zset (worker id scored by its deadline)
    KEYS[12]     wake list
    KEYS[13]     quarantine list (priority digit .. payload)
    KEYS[14]     deaths zset (sha1 of the payload, scored by deaths)
    KEYS[15]     probes zset (sha1 of a quarantined message let out, scored by when)
    KEYS[16]     last probe (STRING: priority digit .. payload; deleted once it was fetched
                 and none waits in quarantine)
    KEYS[17]     dead zset (id scored by failure time)
    KEYS[18]     dead raw hash (id -> payload)
    KEYS[19]     dead reason hash (id -> reason)
    KEYS[20]     seq counter (dead-letter ids)
    KEYS[21]     in-flight key prefix of this queue (no key of that name exists): a dead
                 worker's in-flight index is prefix .. worker id, its batches index .. ':' ..
                 batch id. Those names are only known here (the dead are found in KEYS[11]),
                 so they are derived from this declared key: a suffix after the hash tag
                 keeps the slot, and a cluster routes the script by its declared keys.
    KEYS[22]     unique hash (lock -> message id '@' when it ends)

    ARGV[1]      worker id to mark alive ('' = only recover)
    ARGV[2]      that worker's heartbeat timeout in seconds (its deadline is now + this)
    ARGV[3]      max_recoveries: deaths a probe may survive
    ARGV[4]      result key prefix (keys.RESULT_KEY_PREFIX), ARGV[5] the ttl in ms, ARGV[6] the
                 results channel and ARGV[7] keys.RESULT_BUCKET_CUT: a message dead-lettered
                 here gets a ``dead`` record under its id and, a workflow member, under its
                 workflow's. ARGV[4] = '' (a Redis Cluster, where a record's key has another
                 slot than this queue's): the records are returned instead, for the caller to
                 store
    ARGV[8]      the index of dead letters by message id, '' on a Redis Cluster (_lib.lua)
    ARGV[9]      the queue's name

  Output:
    { how many deliveries went back to the ready lists, to quarantine or to the dead letters,
      how many messages wait in quarantine, then per record (ARGV[4] = '' only) its id and
      its bytes, and last { index changes (ARGV[8] = '' only)... } }
]]
-- @include _lib

local MAX_DEATHS = 10000
local MAX_PROBES = 1000
-- How far into a ready list the last probe is looked for: past this, it counts as fetched.
local PROBE_SCAN = 1000

local now = server_now()
if ARGV[1] ~= '' then
  redis.call('ZADD', KEYS[11], now + tonumber(ARGV[2]), ARGV[1])
end
local max_recoveries = tonumber(ARGV[3])
local failed = {}  -- id, record, ...: the records the caller stores (a cluster)
local changes = {}  -- of the dead-letter index, when the caller makes them

-- A record (middleware/results.py's Record: {state, value = {task, id}, error type, message,
-- traceback}) stored as redis/results.py stores a result: a field of its bucket's hash, after
-- its expiry; or, on a cluster (ARGV[4] = ''), handed back for the caller to store.
local function store(id, record)
  if ARGV[4] == '' then  -- another slot: the caller stores it
    failed[#failed + 1] = id
    failed[#failed + 1] = record
    return
  end
  local ttl = tonumber(ARGV[5])
  local key = ARGV[4] .. string.sub(id, 1, math.max(#id - tonumber(ARGV[7]), 0)) .. '}'
  local t = redis.call('TIME')
  local stamp = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + ttl
  redis.call('HSET', key, id, string.format('%013d', stamp) .. record)
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
  redis.call('PUBLISH', ARGV[6], id)
end

-- What ends with a message dead-lettered here, as brokers/common.py's dead_ends says: a 'dead'
-- record naming it under its own id (whatever its task: the broker cannot tell which keep
-- results) and under its workflow's (headers["flow"], see hurtle/workflows.py) when it is a
-- member; and its unique lock (its field 12, or headers["unique"] from older senders), ended
-- while it still holds this message's id.
local function end_lost(payload, reason)
  local ok, m = pcall(cmsgpack.unpack, payload)
  if not ok or type(m) ~= 'table' or type(m[1]) ~= 'string' or m[1] == '' then
    return
  end
  local id = m[1]
  local headers = m[10]
  if type(headers) ~= 'table' then
    headers = {}
  end
  if ARGV[4] then
    local task = type(m[2]) == 'string' and m[2] or ''
    local record = cmsgpack.pack({ 'dead', { task, id }, 'WorkerLost', reason, '' })
    store(id, record)
    local flow = headers['flow']
    if type(flow) == 'table' and type(flow[1]) == 'string' and flow[1] ~= id then
      store(flow[1], record)
    end
  end
  local lock = m[12]
  if type(lock) ~= 'string' or lock == '' then
    lock = headers['unique']
  end
  if type(lock) == 'string' and lock ~= '' then
    local holder = redis.call('HGET', KEYS[22], lock)
    if holder and string.sub(holder, 1, #id + 1) == id .. '@' then
      redis.call('HDEL', KEYS[22], lock)
    end
  end
end
local dead = redis.call('ZRANGEBYSCORE', KEYS[11], '-inf', '(' .. string.format('%.6f', now))
local moved = 0
local back = {}
for _, worker in ipairs(dead) do
  local held = take_unsettled(KEYS[21] .. worker)
  redis.call('ZREM', KEYS[11], worker)
  local digests = {}
  local probes = 0
  for i, item in ipairs(held) do
    digests[i] = redis.sha1hex(item[2])
    if redis.call('ZREM', KEYS[15], digests[i]) == 1 then
      probes = probes + 1
      digests[i] = { digests[i] }  -- marks a probe
    end
  end
  for i, item in ipairs(held) do
    local digest = digests[i]
    local probe = type(digest) == 'table'
    if probe then
      digest = digest[1]
    end
    local deaths = tonumber(redis.call('ZINCRBY', KEYS[14], 1, digest))
    if (#held == 1 or (probe and probes == 1)) and deaths > max_recoveries then
      local id = 'recovered-' .. string.format('%d', redis.call('INCR', KEYS[20]))
      redis.call('ZADD', KEYS[17], now, id)
      redis.call('HSET', KEYS[18], id, item[2])
      local reason = 'its worker died ' .. string.format('%d', deaths)
        .. ' times while holding it (max_recoveries is ' .. ARGV[3] .. ')'
      redis.call('HSET', KEYS[19], id, reason)
      index_dead(ARGV[8], changes, dead_message_id(item[2]), ARGV[9], id)
      end_lost(item[2], reason)
      redis.call('ZREM', KEYS[14], digest)
    elseif deaths >= 2 then
      redis.call('RPUSH', KEYS[13], string.format('%d', item[1]) .. item[2])
    else
      back[#back + 1] = item
    end
  end
  moved = moved + #held
end
push_front(back, KEYS)
if #dead > 0 then
  local extra = redis.call('ZCARD', KEYS[14]) - MAX_DEATHS
  if extra > 0 then
    redis.call('ZREMRANGEBYRANK', KEYS[14], 0, extra - 1)
  end
end

-- Let one quarantined message out, unless the last one let out is still waiting to be fetched.
-- Once it was fetched and none waits, the last probe is forgotten: fetch.lua looks for it in
-- what it takes while it is known.
local released = false
local last = redis.call('GET', KEYS[16])
local waiting = false
if last then
  local p = string.byte(last, 1) - 48
  waiting = redis.call('LPOS', KEYS[p + 1], string.sub(last, 2), 'MAXLEN', PROBE_SCAN) ~= false
end
if not waiting then
  if redis.call('LLEN', KEYS[13]) > 0 then
    local entry = redis.call('LPOP', KEYS[13])
    local payload = string.sub(entry, 2)
    redis.call('LPUSH', KEYS[string.byte(entry, 1) - 48 + 1], payload)
    redis.call('SET', KEYS[16], entry)
    redis.call('ZADD', KEYS[15], now, redis.sha1hex(payload))
    local extra = redis.call('ZCARD', KEYS[15]) - MAX_PROBES
    if extra > 0 then
      redis.call('ZREMRANGEBYRANK', KEYS[15], 0, extra - 1)
    end
    released = true
  elseif last then
    redis.call('DEL', KEYS[16])
  end
end
if #back > 0 or released then
  wake_one(KEYS[12])
end
local out = { moved, redis.call('LLEN', KEYS[13]) }
for i = 1, #failed do
  out[#out + 1] = failed[i]
end
out[#out + 1] = changes
return out
