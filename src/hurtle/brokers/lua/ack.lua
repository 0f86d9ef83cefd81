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

return ack_groups(KEYS[1], 1, #ARGV)
