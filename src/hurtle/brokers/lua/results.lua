--[[
  Store a batch of task results, each with its expiry, and announce their ids.

  Run in the same pipeline as the acknowledgements, before them: one command per batch rather
  than one SET per result. The keys have one hash tag each (a reader knows only the id): on a
  Redis Cluster this script would have to be split by slot.

  Input:
    KEYS         the result keys (keys.result_key)

    ARGV[1]      the channel that announces results (keys.RESULTS_CHANNEL)
    ARGV[2]      the ids of the results, space-separated (the announcement)
    ARGV         then pairs, one per key in order: ttl in milliseconds, payload

  Output:
    how many results were stored
]]

for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[2 * i + 2], 'PX', ARGV[2 * i + 1])
end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return #KEYS
