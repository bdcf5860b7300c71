"""The claim-and-run engine: how a consumer's inbox rows are claimed and run.

The path of one message, once ingested as an inbox row (``inbox.ingest``):

1. ``claims.BatchClaimer.claim_pass`` claims up to N rows in one transaction: candidates
   locked ``SKIP LOCKED``, the group locks of their groups, one read of those groups' state,
   the ordering rule (``inbox.rules.decide_group``) and one conditional ``UPDATE`` (G4, G5).
2. ``runner.BatchRunner.run`` runs their handlers in one transaction, behind the message
   contract's checks (``gate``), and finishes each row fenced by its claim token (G3, G9);
   ``outcomes`` says what a failure writes and which outcomes free a group.
3. ``cycle.ClaimAndRun`` is one handler thread's loop of the two: each claim looks first at
   the groups the last batch freed (their next heads are waiting, no candidates).
4. ``heads.HeadPass`` promotes a group's head left waiting while its group was busy (G6);
   ``leases.LeaseKeeper`` renews the leases of every held claim while handlers run.

N is the worker's batch size; N = 1 is one message per transaction. Nothing here is
imported by the CLI's option definitions: ``inbox.settings`` holds the defaults they show.
"""
