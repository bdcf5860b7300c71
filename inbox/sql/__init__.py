"""Every SQL statement of the consumer's engine and ingest, one function per statement,
grouped by what runs it: ``claims`` (the claim pass and the runner's batch statements),
``heads`` (the head-of-group pass), ``finish``, ``groups`` (the group marks), ``ingest``,
``contract`` (the message contract's ledger and sequence keys), and ``predicates`` (what
``claims`` and ``heads`` share). The operator commands' own SQL is in ``inbox.ops``.
"""
