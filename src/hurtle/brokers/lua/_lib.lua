-- Helpers shared by hurtle's scripts; spliced in where a script says "-- @include _lib".
-- Not a script on its own. Every helper takes its keys as arguments.
--
-- Conventions shared by all scripts (see hurtle/brokers/keys.py):
--   * ready lists are KEYS[1..10], KEYS[p + 1] holding priority p; head = next to run;
--   * an in-flight receipt is SEQ * 10 + priority, so a receipt says where its message goes back;
--   * time is the server's (TIME), in seconds, so every host agrees on heartbeats and etas.

-- Lua's unpack() is limited by the C stack; commands with many values go in chunks of this size.
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

-- Put everything held in the in-flight hash `key` back at the front of its ready list, oldest
-- first, and delete the hash. Returns how many messages went back.
local function requeue_all(key, ready)
  local flat = redis.call('HGETALL', key)
  local n = #flat / 2
  if n == 0 then
    return 0
  end
  local receipts = {}
  local order = {}
  for i = 1, n do
    receipts[i] = tonumber(flat[2 * i - 1])
    order[i] = i
  end
  -- Newest first: each LPUSH goes in front, so the oldest ends up at the head.
  table.sort(order, function(a, b) return receipts[a] > receipts[b] end)
  for _, i in ipairs(order) do
    redis.call('LPUSH', ready[(receipts[i] % 10) + 1], flat[2 * i])
  end
  redis.call('DEL', key)
  return n
end
