"""One handler thread's claim-and-run cycle: claim a batch, looking first at the groups the
last batch freed; run it; keep the groups it freed for the next claim.

A freed group's next head is WAITING, not a candidate: no claim pass would look at it until
the head-of-group pass, so the thread that freed it asks for it in its next pass. A group a
pass could not decide (its lock busy for a moment, the batch full) is asked for again, up to
``FREED_TRIES`` passes; past that the head-of-group pass promotes its head.

The worker's handler threads (``inbox.worker``) put their waits and wake-ups around ``claim``
and ``run``; the integration tests' kit calls the same two until nothing is claimable, so
the tests drive the code the worker runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from inbox.engine.claims import BatchClaimer, Claim, ClaimPass
from inbox.engine.leases import LeaseKeeper
from inbox.engine.outcomes import frees_group
from inbox.engine.runner import BatchRunner

FREED_TRIES = 50


class ClaimAndRun:
    """``batch_size``: messages per claim (N); ``share``: the handler threads of the worker
    (``BatchClaimer.claim_pass``). ``freed``: the groups to look at first in the next claim,
    with the passes that could not decide them. One per thread: nothing here is shared."""

    def __init__(
        self,
        claimer: BatchClaimer,
        runner: BatchRunner,
        leases: LeaseKeeper,
        *,
        batch_size: int,
        share: int = 1,
    ) -> None:
        self.claimer = claimer
        self.runner = runner
        self.leases = leases
        self.batch_size = batch_size
        self.share = share
        self.freed: dict[str, int] = {}

    def claim(self) -> ClaimPass:
        """One claim pass, the freed groups first; keeps the ones it could not decide."""
        result = self.claimer.claim_pass(self.batch_size, list(self.freed), share=self.share)
        freed = self.freed
        self.freed = {g: freed[g] + 1 for g in result.undecided if freed[g] < FREED_TRIES}
        return result

    def run(self, claims: Sequence[Claim]) -> list[tuple[Claim, str]]:
        """Run a claimed batch, its leases renewed meanwhile by the keeper's heartbeat;
        returns (claim, outcome) as ``BatchRunner.run`` does, and keeps the groups it freed."""
        self.leases.hold(claims)
        try:
            outcomes = self.runner.run(claims)
        finally:
            self.leases.drop(claims)
        consumer = self.runner.consumer
        for claim, outcome in outcomes:
            group = claim.serial_group
            if group is not None and frees_group(outcome, consumer, claim.row.queue):
                self.freed.setdefault(group, 0)
        return outcomes
