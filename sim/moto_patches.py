"""Patches to moto (5.x) that make the emulator behave as the AWS services do where the
fleet depends on it: a Query reads one partition, a message made visible again wakes a
long poll, a transaction copies the items it names rather than the tables, a batch keeps
its entries' system attributes. Each is
idempotent and applied by :func:`sim.emulator.build_app`."""

from __future__ import annotations

import threading
from typing import Any, Mapping


def _partition_queries() -> None:
    """Make moto read one partition for a Query on a table's own key, as DynamoDB does.

    moto 5.2 answers such a Query by listing and sorting every item of the table, then
    keeping the partition's: O(table) per request, inside the lock that serialises
    DynamoDB. A long run's messages table holds 100,000s of rows, and every takeover reads
    where a stream's stored messages end: queries of a second each, renewals stuck behind
    them past their timeout, sessions lost, more takeovers. The partition's items (those
    the sort key condition keeps) are exactly what moto keeps of that list, so the answer
    is the same. Idempotent."""
    from moto.dynamodb.models.table import Table

    if getattr(Table.query, "_wsfleet_partition", False):
        return
    query = Table.query

    def partition_query(self: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        index_name = args[6] if len(args) > 6 else kwargs.get("index_name")
        if index_name or hash_key is None or not self.range_key_attr:
            return query(self, hash_key, *args, **kwargs)
        partition = list(self.items.get(hash_key, {}).values())
        comparison, values = (args[0], args[1]) if len(args) > 1 else (kwargs.get("range_comparison"), kwargs.get("range_objs"))
        if comparison:
            # The sort key condition, with moto's own comparison (moto applies it again):
            # otherwise moto sizes every item of the partition before it filters them.
            partition = [i for i in partition if i.range_key is not None and i.range_key.compare(comparison, values)]
        self.all_items = lambda: partition  # the instance attribute shadows the method for this call
        try:
            return query(self, hash_key, *args, **kwargs)
        finally:
            del self.all_items

    partition_query._wsfleet_partition = True  # type: ignore[attr-defined]
    Table.query = partition_query


def _visible_again_wakes_long_polls() -> None:
    """Make a message made visible again by ChangeMessageVisibility wake the long polls
    waiting on its queue, as SQS does (a long poll returns as soon as a message is
    available). moto 5.2 wakes them only when a message is sent, and a message put back
    with visibility 0 only becomes visible once its millisecond has passed (visible
    means "now > visible_at"): a poll woken in that millisecond went back to sleep. It
    waited up to a second, each time, for a waiting poll's next look. Idempotent."""
    from moto.core.utils import unix_time_millis
    from moto.sqs.models import SQSBackend

    if getattr(SQSBackend.change_message_visibility, "_wsfleet_wakes", False):
        return
    change = SQSBackend.change_message_visibility

    def change_and_wake(self: Any, queue_name: str, receipt_handle: str, visibility_timeout: int) -> None:
        change(self, queue_name, receipt_handle, visibility_timeout)
        if int(visibility_timeout) == 0:
            queue = self.get_queue(queue_name)
            with queue._messages_lock:
                for message in queue._messages:
                    if message.had_receipt_handle(receipt_handle):
                        message.visible_at = min(message.visible_at, unix_time_millis() - 1)
                        queue.pending_messages.discard(message)
                queue._messages_lock.notify_all()

    change_and_wake._wsfleet_wakes = True  # type: ignore[attr-defined]
    SQSBackend.change_message_visibility = change_and_wake


def _transactions_copy_items_not_tables() -> None:
    """Make moto back up the items a TransactWriteItems targets, not whole tables.

    moto 5.2 deep-copies the whole table for every entry of a transaction, to roll back
    if one fails: with 1,000 connections one copy takes some 36 ms, so a checkpoint of 25
    Updates took a second (100: four) inside the lock that serialises DynamoDB, and every
    other request waited behind it. A transaction can only change the items it names, so
    a copy of those is as good a backup. We take it, make moto's whole-table copy return
    the table itself for the call (the module's ``copy`` swapped for a shim: safe, as every
    DynamoDB request runs under :class:`SerializedDynamoDB`'s lock; moto's rollback then
    puts the same table back), and on any exception put the copies back, last first (the
    first copy of an item named twice is the one from before), then re-raise. The copies
    are re-inserted as the stored objects: moto's update mutates the stored Item in place.
    moto checks, applies and answers exactly as before (the same errors, in the same
    order). An entry whose table or key we cannot resolve, or a table with a stream
    (moto's rollback also takes back its stream records), gets moto's own method
    unchanged. Idempotent."""
    import copy
    import types

    import moto.dynamodb.models as models
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    if getattr(DynamoDBBackend.transact_write_items, "_wsfleet_item_copies", False):
        return
    transact = DynamoDBBackend.transact_write_items

    def deepcopy(value: Any, memo: dict[int, Any] | None = None) -> Any:
        return value if isinstance(value, Table) else copy.deepcopy(value, memo)

    shim = types.SimpleNamespace(**{**vars(copy), "deepcopy": deepcopy})
    Snapshot = tuple[Table, Any, Any, Any, bool]  # table, hash, range (None: no sort key), item or None, partition existed

    def snapshot(self: Any, entry: Mapping[str, Any]) -> Snapshot | None:
        """The targeted item as it is now (a deep copy), None if it cannot be resolved."""
        if len(entry) != 1:
            return None
        op_type, op = next(iter(entry.items()))
        if op_type not in ("Put", "Update", "Delete", "ConditionCheck") or not isinstance(op, Mapping):
            return None
        table = self.tables.get(op.get("TableName"))
        if table is None or table.stream_shard is not None:
            return None
        key = op.get("Item" if op_type == "Put" else "Key")
        if not isinstance(key, Mapping) or table.hash_key_attr not in key:
            return None
        hash_value = DynamoType(key[table.hash_key_attr])
        if table.range_key_attr is None:
            item = table.items.get(hash_value)
            return table, hash_value, None, copy.deepcopy(item), True
        if table.range_key_attr not in key:
            return None
        range_value = DynamoType(key[table.range_key_attr])
        existed = hash_value in table.items
        item = table.items[hash_value].get(range_value) if existed else None
        return table, hash_value, range_value, copy.deepcopy(item), existed

    def restore(snapshots: list[Snapshot]) -> None:
        for table, hash_value, range_value, item, existed in reversed(snapshots):
            if range_value is None:
                if item is None:
                    table.items.pop(hash_value, None)
                else:
                    table.items[hash_value] = item
                continue
            partition = table.items[hash_value]
            if item is None:
                partition.pop(range_value, None)
            else:
                partition[range_value] = item
            if not existed and not partition:
                # moto's reads create the partition (items is a defaultdict); it was not there
                del table.items[hash_value]

    def transact_with_item_copies(self: Any, transact_items: list[dict[str, Any]]) -> None:
        try:
            snapshots = [snapshot(self, entry) for entry in transact_items]
        except Exception:  # a key moto refuses (an unhashable type, ...): let it say so
            snapshots = [None]
        if len(transact_items) > 100 or not all(snapshots):  # moto refuses these before it copies
            return transact(self, transact_items)
        swapped = models.copy
        models.copy = shim
        try:
            return transact(self, transact_items)
        except BaseException:
            restore(snapshots)  # type: ignore[arg-type]
            raise
        finally:
            models.copy = swapped

    transact_with_item_copies._wsfleet_item_copies = True  # type: ignore[attr-defined]
    DynamoDBBackend.transact_write_items = transact_with_item_copies


def _kinesis_sequence_ends_in_constant_time() -> None:
    """Make moto find a shard's first and last sequence numbers without copying the shard.

    moto 5.2 numbers each record it puts from ``list(self.records.keys())[-1]``: a copy of
    every key of the shard per record, so a PutRecords of 500 on a shard of 30,000 copies
    15 million keys (about a second of the Kinesis lock). A benchmark's stream reaches that
    in a minute at 500 frames/s; PutRecords then outlast the worker's read timeout, are
    sent again, and grow the shard faster. The keys are ascending integers in an insertion
    ordered dict, so the first and last of it are the same numbers. Idempotent."""
    from moto.kinesis.models import Shard

    if getattr(Shard.get_max_sequence_number, "_wsfleet_constant", False):
        return

    def get_min_sequence_number(self: Any) -> int:
        return next(iter(self.records)) if self.records else 0

    def get_max_sequence_number(self: Any) -> int:
        return next(reversed(self.records)) if self.records else 0

    get_max_sequence_number._wsfleet_constant = True  # type: ignore[attr-defined]
    Shard.get_min_sequence_number = get_min_sequence_number
    Shard.get_max_sequence_number = get_max_sequence_number


_batch_system_attributes = threading.local()


def _batches_keep_system_attributes() -> None:
    """Make SendMessageBatch keep each entry's ``MessageSystemAttributes`` (the hint's
    ``AWSTraceHeader``), as SQS does. moto 5.2 keeps them on SendMessage but its batch
    sends each entry without them, so a worker's hints (always batched) arrived with no
    trace. The batch sends its entries in order, in the request's thread: a thread-local
    queue of their system attributes gives each send its own. Idempotent."""
    from moto.sqs.models import SQSBackend

    if getattr(SQSBackend.send_message_batch, "_wsfleet_system_attributes", False):
        return
    send_batch, send = SQSBackend.send_message_batch, SQSBackend.send_message

    def send_batch_keeping(self: Any, queue_name: str, entries: dict[str, dict[str, Any]]) -> Any:
        _batch_system_attributes.pending = [entry.get("MessageSystemAttributes") for entry in entries.values()]
        try:
            return send_batch(self, queue_name, entries)
        finally:
            _batch_system_attributes.pending = None

    def send_keeping(self: Any, *args: Any, **kwargs: Any) -> Any:
        pending = getattr(_batch_system_attributes, "pending", None)
        if pending and kwargs.get("system_attributes") is None:
            kwargs["system_attributes"] = pending.pop(0)
        return send(self, *args, **kwargs)

    send_batch_keeping._wsfleet_system_attributes = True  # type: ignore[attr-defined]
    SQSBackend.send_message_batch = send_batch_keeping
    SQSBackend.send_message = send_keeping
