"""A worker written against the Python client that openapi-python-client
generates from the live replica's /openapi.json (.ci/clients generates it,
then runs this file with the package on PYTHONPATH): reserve and release a
lease, a batch, and the work registry's enqueue -> claim -> done and release,
all through the generated code, against a real `quota-arbiter serve`."""

import datetime
import os
import re

from quota_arbiter_client import AuthenticatedClient, Client
from quota_arbiter_client.api.admin import patch_quota, put_flow, put_quota
from quota_arbiter_client.api.reserve import report_upstream, reserve, reserve_batch
from quota_arbiter_client.api.work import claim, done, enqueue, get_item, release
from quota_arbiter_client.models import (
    BatchBody,
    ClaimBody,
    EnqueueBody,
    FeedbackBody,
    FlowBody,
    LeaseBody,
    Mode,
    Outcome,
    QuotaLimits,
    QuotaPatch,
    ReleaseBody,
    ReserveBody,
)

BASE = os.environ["QA_BASE"]
ADMIN = AuthenticatedClient(base_url=BASE, token=os.environ["QA_TOKEN"], raise_on_unexpected_status=True)
WORKER = Client(base_url=BASE, raise_on_unexpected_status=True)
DIGITS = re.compile(r"^[0-9]+$")


def declare(quota: str, flow: str, **limits) -> None:
    answer = put_quota.sync_detailed(quota, client=ADMIN, body=QuotaLimits(**limits))
    assert answer.status_code == 200, answer.content
    answer = put_flow.sync_detailed(
        flow, client=ADMIN, body=FlowBody(quota=quota, mode=Mode.ENFORCE)
    )
    assert answer.status_code == 200, answer.content


def test_a_lease_is_released_with_the_id_the_grant_gave():
    declare("py-places", "py-emit", hourly_ceiling=100, max_in_flight=1)
    granted = reserve.sync(client=WORKER, body=ReserveBody(flow="py-emit"))
    assert granted.outcome == Outcome.GRANTED, granted
    assert isinstance(granted.lease_id, str) and DIGITS.match(granted.lease_id), granted
    # The one place is held: the next caller is deferred on it.
    held = reserve.sync(client=WORKER, body=ReserveBody(flow="py-emit"))
    assert held.outcome == Outcome.DEFERRED, held
    freed = report_upstream.sync(
        client=WORKER,
        body=FeedbackBody(flow="py-emit", lease_id=granted.lease_id, status=200),
    )
    assert freed.released is True, freed
    again = reserve.sync(client=WORKER, body=ReserveBody(flow="py-emit"))
    assert again.outcome == Outcome.GRANTED, again


def test_a_batch_answers_each_item():
    declare("py-batch", "py-batch-flow", hourly_ceiling=2)
    due = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=1)
    items = [
        ReserveBody(flow="py-batch-flow", ref="a"),
        ReserveBody(flow="py-batch-flow", ref="b", count=2),
        ReserveBody(flow="py-batch-flow", ref="c", deadline=due),
    ]
    answer = reserve_batch.sync(client=WORKER, body=BatchBody(items=items))
    outcomes = {d.ref: d.outcome for d in answer.decisions}
    assert outcomes == {
        "a": Outcome.GRANTED,
        "b": Outcome.DEFERRED,
        "c": Outcome.BYPASSED,
    }, answer


def test_work_is_enqueued_claimed_and_done_or_released():
    declare("py-work", "py-job", hourly_ceiling=100, max_in_flight=2)
    # A ref alone names the work: no payload.
    first = enqueue.sync(client=WORKER, body=EnqueueBody(flow="py-job", ref="job-1"))
    assert first.payload is None and first.state == "pending", first
    second = enqueue.sync(
        client=WORKER, body=EnqueueBody(flow="py-job", ref="job-2", payload={"n": [1, "two"]})
    )
    assert second.payload == {"n": [1, "two"]}, second

    taken = claim.sync(client=WORKER, body=ClaimBody(worker="py-w", max_=2))
    assert len(taken.items) == 2, taken
    by_ref = {c.item.ref: c for c in taken.items}
    for claimed in taken.items:
        assert DIGITS.match(claimed.decision.lease_id), claimed

    finished = done.sync(by_ref["job-1"].item.id, client=WORKER, body=LeaseBody(worker="py-w"))
    assert finished.state == "done", finished
    given_back = release.sync(
        by_ref["job-2"].item.id, client=WORKER, body=ReleaseBody(worker="py-w", retry_in="1s")
    )
    assert given_back.state == "pending", given_back
    read = get_item.sync(by_ref["job-2"].item.id, client=WORKER)
    assert read.ref == "job-2" and read.attempts == 1, read


def test_patch_changes_only_what_exists():
    declare("py-patched", "py-patched-flow", hourly_ceiling=10)
    changed = patch_quota.sync(
        "py-patched", client=ADMIN, body=QuotaPatch(hourly_ceiling=20)
    )
    assert changed.hourly_ceiling == 20, changed
    typo = patch_quota.sync_detailed("py-ptached", client=ADMIN, body=QuotaPatch(hourly_ceiling=20))
    assert typo.status_code == 404, typo.content
