--[[
  Acknowledge deliveries of one worker: they leave the broker for good.

  The common case costs no work per message: when an ack covers every message of a batch that is
  still held and none of it was settled before, the batch is simply deleted. Otherwise each
  message is marked in the batch's bitmap (BITFIELD, one call per batch), so that a message
  acknowledged twice counts once and recovery skips what was settled.

  Input:
    KEYS[1]      in-flight index of the worker (batch id -> count held)

    ARGV         groups of three: batch id, k, and the k message indexes of that batch as
                 little-endian uint32s packed in one string (distinct, ascending)

  Output:
    how many deliveries were held until now
]]
-- @include _lib

local index = KEYS[1]
local settled = 0
for g = 1, #ARGV, 3 do
  local batch = ARGV[g]
  local k = tonumber(ARGV[g + 1])
  local left = tonumber(redis.call('HGET', index, batch))
  if left then
    local key = index .. ':' .. batch
    if k == left and redis.call('EXISTS', key .. ':done') == 0 then
      drop_batch(index, batch)
      settled = settled + k
    else
      local packed = ARGV[g + 2]
      local ops = {}
      local pos = 1
      for _ = 1, k do
        local i
        i, pos = struct.unpack('<I4', packed, pos)
        ops[#ops + 1] = 'SET'
        ops[#ops + 1] = 'u1'
        ops[#ops + 1] = i
        ops[#ops + 1] = 1
      end
      local fresh = 0
      local j = 1
      while j <= #ops do
        local last = math.min(j + CHUNK - 1, #ops)
        for _, old in ipairs(redis.call('BITFIELD', key .. ':done', unpack(ops, j, last))) do
          if old == 0 then
            fresh = fresh + 1
          end
        end
        j = last + 1
      end
      if fresh >= left then
        drop_batch(index, batch)
      elseif fresh > 0 then
        redis.call('HINCRBY', index, batch, -fresh)
      end
      settled = settled + fresh
    end
  end
end
return settled
