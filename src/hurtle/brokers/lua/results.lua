--[[
  Store a batch of task results, each with its expiry, and announce their ids.

  Run in the same pipeline as the acknowledgements, before them: one command per batch rather
  than one SET per result. The keys have one hash tag each (a reader knows only the id), so on a
  Redis Cluster this script is not used: each result is a SET of its own there (cluster.py).

  Input:
    KEYS         the result keys (keys.result_key)

    ARGV[1]      the channel that announces results (keys.RESULTS_CHANNEL)
    ARGV[2]      the ids of the results, space-separated (the announcement)
    ARGV[3]      their time to live, in milliseconds (one call per distinct ttl)
    ARGV[4..]    the payloads, one per key, in order

  Output:
    how many results were stored
]]

local ttl = ARGV[3]
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[i + 3], 'PX', ttl)
end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return #KEYS
