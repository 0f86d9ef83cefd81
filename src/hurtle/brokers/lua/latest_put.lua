--[[
  Record the latest call of debounce keys of one queue (``Broker.put_latest``), each key
  a STRING of its own that expires on its own; a later record replaces an earlier one. A key
  may come more than once: the last of it wins.

  When a record replaces one naming another call (the id before '@' differs), that call may
  have been replaced: the queue's flag says so for as long as the record lives (it is only
  ever lengthened), and the fetch script hands it to the worker, whose debounce check reads no
  record while it is down. A call's own record written again keeps a raised flag up as long.

  Input:
    KEYS[1]     the queue's replaced flag (``QueueKeys.replaced``)
    KEYS[2..n+1]  the keys' records (``QueueKeys.latest``), all under the queue's hash tag

    ARGV[1]     milliseconds each record is kept
    ARGV[2..n+1]  the values (a call's id, '@' and when it was made), in the order of KEYS

  Output:
    how many were recorded
]]
local ttl = ARGV[1]
local replaced = false
local renewed = false
for i = 2, #KEYS do
  local value = ARGV[i]
  local old = redis.call('SET', KEYS[i], value, 'PX', ttl, 'GET')
  if old and not replaced then
    local at = string.find(value, '@', 1, true) or #value
    if string.sub(old, 1, at) == string.sub(value, 1, at) then
      renewed = true
    else
      replaced = true
    end
  end
end
if replaced or (renewed and redis.call('EXISTS', KEYS[1]) == 1) then
  if redis.call('PTTL', KEYS[1]) < tonumber(ttl) then  -- -2: none yet
    redis.call('SET', KEYS[1], '1', 'PX', ttl)
  end
end
return #KEYS - 1
