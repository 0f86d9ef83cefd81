--[[
  Count one chord member, on a Redis Cluster, where ack_flow.lua cannot run (the keys of one
  workflow step span slots: the worker's queue, the next link's, the chord's, the results').
  Same record as ack_flow.lua's: a field per member index (HSETNX: a member counted twice counts
  once), and 'fired' once the callback is out. Here the callback is published by the caller,
  which sets 'fired' only after: a caller that dies in between leaves the count complete and
  'fired' unset, so the member delivered again publishes the callback (at least once, never
  lost).

  Input:
    KEYS[1]      the chord's hash

    ARGV[1]      member index, ARGV[2] member count, ARGV[3] member payload, ARGV[4] ttl in ms

  Output:
    1 when every member is counted and the callback is not out yet: the caller publishes it,
    then sets 'fired'; 0 otherwise
]]

redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
-- the members' fields, and 'fired' once the callback is out: total + 1
if redis.call('HLEN', KEYS[1]) == tonumber(ARGV[2]) then
  return 1
end
return 0
