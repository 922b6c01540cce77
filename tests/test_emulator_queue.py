"""The local START queue keeps the stack's dead-letter rule: a hint received
``MAX_HINT_RECEIVES`` times without a delete moves to the dead-letter queue, whose depth
:func:`sim.emulator.dead_letters` reads (the figure the stack's alarm watches)."""

from __future__ import annotations

from sim.emulator import dead_letters
from wsfleet import schema


def _receive(sqs, url: str) -> list[dict]:
    return sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=0, VisibilityTimeout=0).get("Messages", [])


def test_a_hint_received_five_times_without_a_delete_lands_in_the_dead_letter_queue(aws_env, sqs):
    url = aws_env["QUEUE_URL"]
    sqs.send_message(QueueUrl=url, MessageBody='{"connection_id": "c1"}')

    for _ in range(schema.MAX_HINT_RECEIVES):
        assert len(_receive(sqs, url)) == 1  # put back at once, as a declining worker does
        assert dead_letters(sqs, url) == 0

    assert _receive(sqs, url) == []  # the next receive moves it aside instead
    assert dead_letters(sqs, url) == 1


def test_a_hint_deleted_after_its_receives_never_reaches_the_dead_letter_queue(aws_env, sqs):
    url = aws_env["QUEUE_URL"]
    sqs.send_message(QueueUrl=url, MessageBody='{"connection_id": "c1"}')
    for _ in range(schema.MAX_HINT_RECEIVES - 1):
        _receive(sqs, url)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=_receive(sqs, url)[0]["ReceiptHandle"])

    assert _receive(sqs, url) == []
    assert dead_letters(sqs, url) == 0
