"""Channels: pub/sub beside the queues, buffered on the way out, with every loss counted.

    prices = app.channel("prices")                  # flush at 1,000 messages or 5 ms
    prices.publish({"sym": "ABC", "px": 1.5})
    with app.channel("prices").subscribe() as sub:  # or app.subscribe("prices.*")
        for msg in sub:                             # msg.channel, msg.data
            ...

Modules: ``channel`` (publishing, buffering, the flusher), ``subscription`` (receiving, gap
counting), ``frame`` (the wire format), ``backend`` (the backend contract) and one module per
store: ``memory``, ``redis``, ``sqlite``. Channels are not queues: a message reaches the
subscribers connected when it is published, or nobody; what is missed is counted, not replayed.
"""

from .channel import DEFAULT_BUFFER, DEFAULT_FLUSH_INTERVAL, Channel, ChannelHub
from .subscription import AsyncSubscription, ChannelMessage, LossCallback, Subscription

__all__ = [
    "DEFAULT_BUFFER",
    "DEFAULT_FLUSH_INTERVAL",
    "AsyncSubscription",
    "Channel",
    "ChannelHub",
    "ChannelMessage",
    "LossCallback",
    "Subscription",
]
