"""The ``outbox`` command and its demos: the layer above outbox/, relay/ and inbox/.

It may import all three; none of them imports it (``make lint`` checks the layers).
"""
