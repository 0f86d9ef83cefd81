--[[
  Record the latest call of debounce keys of one queue (``Broker.put_latest``), each key
  a STRING of its own that expires on its own; a later record replaces an earlier one.

  Input:
    KEYS[1..n]  the keys' records (``QueueKeys.latest``), all under the queue's hash tag

    ARGV[1]     milliseconds each record is kept
    ARGV[2..n+1]  the values (a call's id and when it was made), in the order of KEYS

  Output:
    how many were recorded
]]
local ttl = ARGV[1]
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[i + 1], 'PX', ttl)
end
return #KEYS
