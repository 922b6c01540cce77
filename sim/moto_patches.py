"""Patches to moto (5.x) that make the emulator behave as the AWS services do where the
fleet depends on it: a Query reads one partition, a message made visible again wakes a
long poll, a transaction copies the items it names rather than the tables, a batch keeps
its entries' system attributes. Each is
idempotent and applied by :func:`sim.emulator.build_app`."""

from __future__ import annotations

import bisect
import threading
from typing import Any, Mapping


class SortedPartition(dict):
    """One partition of a table with a sort key (moto keeps each as a dict, sort key ->
    item), with its sort keys kept in order as DynamoDB keeps them: a key added after the
    last (a stream's next message) is appended, one added elsewhere is inserted where it
    sorts, and a removal makes the next read sort them again. Copies (moto's deep copies)
    start without the order and sort on their first read."""

    _keys: list | None = None

    def __getstate__(self) -> None:  # a copy's items are set one by one: it sorts them when read
        return None

    def __setitem__(self, key: Any, value: Any) -> None:
        keys = self._keys
        if keys is not None and key not in self:
            if not keys or keys[-1] < key:
                keys.append(key)
            else:
                bisect.insort(keys, key)
        super().__setitem__(key, value)

    def _changed(self) -> None:
        self._keys = None

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        self._changed()

    def pop(self, *args: Any) -> Any:
        try:
            return super().pop(*args)
        finally:
            self._changed()

    def popitem(self) -> Any:
        try:
            return super().popitem()
        finally:
            self._changed()

    def clear(self) -> None:
        super().clear()
        self._changed()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._changed()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def sorted_keys(self) -> list:
        if self._keys is None:
            self._keys = sorted(self)
        return self._keys


# moto's sort key comparisons, by the names it may give them
_COMPARISONS = {"=": "EQ", "<=": "LE", "<": "LT", ">=": "GE", ">": "GT"}
# moto's Table.query's positional parameters after the hash key
_QUERY_PARAMS = ("range_comparison", "range_objs", "limit", "exclusive_start_key", "scan_index_forward",
                 "projection_expressions", "index_name")


def _partition_queries() -> None:
    """Make a Query on a table's own key read one partition, in order, as DynamoDB does.

    moto 5.2 answers such a Query by listing every item of the table, sorting them and
    keeping the partition's: O(table log table) per request, inside the lock that
    serialises DynamoDB. A long run's messages table holds 100,000s of rows, one hostile
    peer's partition alone 100,000 and more, and every takeover reads where a stream's
    stored messages end (the partition's last item): such a Query took 0.34 s at 60,000
    items in one partition and grew with it, and every renewal and move of the fleet
    waited behind it. Here each partition keeps its sort keys in order
    (:class:`SortedPartition`); the sort key condition is a slice of them found by
    bisection, and a Query with a Limit gets the first Limit + 1 items of that slice in
    its direction after its ExclusiveStartKey (what moto reads of the list before it
    stops: its filter expression is applied after). moto answers from that list exactly
    as from the whole table. A condition it may not slice (``begins_with``), the legacy
    QueryFilter: the whole partition. An index keyed on the table's own partition key
    (the messages table's sparse ``markers``) holds only items of that partition: moto
    reads them (it sorted the whole table for each such Query, 146,000 rows late in a
    30-minute soak, while the read API counted a hostile connection's markers every
    couple of seconds); any other index: moto's own path. Idempotent."""
    from collections import defaultdict

    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    if getattr(Table.query, "_wsfleet_partition", False):
        return
    query, init = Table.query, Table.__init__

    def init_sorted(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if self.range_key_attr:
            self.items = defaultdict(SortedPartition)

    def window(self: Any, partition: Any, params: dict[str, Any]) -> list | None:
        """The items moto would read of the partition, in its order; None: every item."""
        if not isinstance(partition, SortedPartition):
            return None
        keys = partition.sorted_keys()
        comparison, values = params.get("range_comparison"), params.get("range_objs") or []
        comparison = _COMPARISONS.get(comparison, comparison)
        lo, hi = 0, len(keys)
        if comparison in ("EQ", "GE", "GT", "BETWEEN"):
            lo = (bisect.bisect_right if comparison == "GT" else bisect.bisect_left)(keys, values[0])
        if comparison in ("EQ", "LE", "LT", "BETWEEN"):
            upper = values[-1] if comparison == "BETWEEN" else values[0]
            hi = (bisect.bisect_left if comparison == "LT" else bisect.bisect_right)(keys, upper)
        elif comparison not in (None, "GE", "GT"):
            return None
        forward = params.get("scan_index_forward") is not False
        start = params.get("exclusive_start_key")
        if start and self.range_key_attr in start:
            after = DynamoType(start[self.range_key_attr])
            if forward:
                lo = max(lo, bisect.bisect_right(keys, after))
            else:
                hi = min(hi, bisect.bisect_left(keys, after))
        limit = params.get("limit")
        if limit:
            if forward:
                hi = min(hi, lo + int(limit) + 1)
            else:
                lo = max(lo, hi - int(limit) - 1)
        return [partition[k] for k in keys[lo:max(lo, hi)]]

    def on_table_key(self: Any, index_name: str) -> bool:
        """Whether the index is partitioned by the table's own partition key."""
        for index in (*self.global_indexes, *self.indexes):
            if index.name == index_name:
                hashes = [k["AttributeName"] for k in index.schema if k["KeyType"] == "HASH"]
                return hashes == [self.hash_key_attr]
        return False

    def partition_query(self: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        params = {**dict(zip(_QUERY_PARAMS, args, strict=False)), **kwargs}
        index = params.get("index_name")
        if hash_key is None or not self.range_key_attr or (index and not on_table_key(self, index)):
            return query(self, hash_key, *args, **kwargs)
        partition = self.items.get(hash_key, {})
        items = None if index or params.get("filter_kwargs") or kwargs.keys() - set(_QUERY_PARAMS) - {
            "consistent_read", "filter_expression", "hash_key_conditions", "range_key_conditions"} else window(
            self, partition, params)
        if items is None:
            items = list(partition.values())
        self.all_items = lambda: items  # the instance attribute shadows the method for this call
        try:
            return query(self, hash_key, *args, **kwargs)
        finally:
            del self.all_items

    partition_query._wsfleet_partition = True  # type: ignore[attr-defined]
    Table.query = partition_query
    Table.__init__ = init_sorted


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
