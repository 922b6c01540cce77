"""DynamoDB in memory, at the boto3 client's API: what the product's store classes call
(GetItem, PutItem, UpdateItem, DeleteItem, Query on the table or a GSI, Scan with
segments, BatchGetItem, TransactWriteItems), with conditions, the answers' shapes and the
errors botocore raises (ClientError with DynamoDB's codes), so that the store runs
unchanged against it.

Items are kept unmarshalled; each GSI keeps its partitions as sorted lists. Every
request is charged to the partitions it touches (:mod:`.capacity`), which refuses it
whole when a partition would pass its limit this second. Requests run one at a time
(the simulation has one thread): a transaction is atomic by construction and never
conflicts.
"""

from __future__ import annotations

import bisect
from decimal import Decimal
from typing import Any, Mapping

from botocore.exceptions import ClientError

from . import expressions as ex
from .capacity import INDEX_OVERHEAD_BYTES, Partitions, Throttled, item_size, read_units, write_units


WIRE_CACHE_ITEMS = 50_000


def marshal_value(v: Any) -> dict:
    if isinstance(v, str):
        return {"S": v}
    if isinstance(v, bool):
        return {"BOOL": v}
    if isinstance(v, (int, Decimal, float)):
        return {"N": str(v)}
    if v is None:
        return {"NULL": True}
    if isinstance(v, (set, frozenset)):
        first = next(iter(v))
        return {"NS": [str(x) for x in v]} if isinstance(first, (int, Decimal)) else {"SS": list(v)}
    if isinstance(v, dict):
        return {"M": {k: marshal_value(x) for k, x in v.items()}}
    if isinstance(v, (list, tuple)):
        return {"L": [marshal_value(x) for x in v]}
    raise ValueError(f"cannot store {type(v).__name__}")


def unmarshal_value(av: Mapping[str, Any]) -> Any:
    (kind, v), = av.items()
    if kind == "S":
        return v
    if kind == "N":
        return int(v) if v.lstrip("-").isdigit() else Decimal(v)
    if kind == "BOOL":
        return v
    if kind == "SS":
        return set(v)
    if kind == "NS":
        return {int(x) for x in v}
    if kind == "M":
        return {k: unmarshal_value(x) for k, x in v.items()}
    if kind == "L":
        return [unmarshal_value(x) for x in v]
    if kind == "NULL":
        return None
    raise ValueError(f"unsupported attribute type {kind}")


def marshal(item: Mapping[str, Any]) -> dict:
    return {k: marshal_value(v) for k, v in item.items()}


def unmarshal(item: Mapping[str, Any] | None) -> dict:
    return {k: unmarshal_value(v) for k, v in (item or {}).items()}


def _error(code: str, message: str, op: str, status: int = 400, **extra: Any) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}, **extra}, op)


def _throttled(exc: Throttled, op: str) -> ClientError:
    return _error("ProvisionedThroughputExceededException", str(exc), op)


def _sort_range(rows: list[tuple[Any, Any]], op: str, bound: Any) -> tuple[Any, int]:
    """Where the rows (sorted by their sort key) that a key condition's ``<sort> <op>
    :bound`` keeps lie, by bisection: (lo, hi), or (None, 0) unless the bound and every
    row's key are strings (one str sorts beside another; a partition cannot mix a str with
    a number, which do not sort together), where :func:`ex._compare` would be needed."""
    if not rows or type(bound) is not str or type(rows[0][0]) is not str or type(rows[-1][0]) is not str:
        return (None, 0) if rows else (0, 0)
    left = bisect.bisect_left(rows, bound, key=_sort_key)
    right = bisect.bisect_right(rows, bound, key=_sort_key)
    return {"=": (left, right), "<": (0, left), "<=": (0, right), ">": (right, len(rows)), ">=": (left, len(rows))}[op]


def _sort_key(row: tuple[Any, Any]) -> Any:
    return row[0]


class Index:
    def __init__(self, table: str, spec: Mapping[str, Any], key: str) -> None:
        self.name = spec["IndexName"]
        keys = {k["KeyType"]: k["AttributeName"] for k in spec["KeySchema"]}
        self.hash, self.range = keys["HASH"], keys.get("RANGE")
        projection = spec.get("Projection", {})
        self.projected = (
            None
            if projection.get("ProjectionType") == "ALL"
            else {key, self.hash, *([self.range] if self.range else []), *projection.get("NonKeyAttributes", [])}
        )
        self.where = f"{table}:{self.name}"
        self.partitions: dict[Any, list[tuple[Any, Any]]] = {}

    def key_of(self, item: Mapping | None, pk: Any) -> tuple[Any, tuple[Any, Any]] | None:
        if item is None or self.hash not in item or (self.range and self.range not in item):
            return None
        return item[self.hash], (item[self.range] if self.range else "", pk)

    def entry(self, item: Mapping) -> dict:
        return dict(item) if self.projected is None else {k: item[k] for k in self.projected if k in item}

    def move(self, old: tuple | None, new: tuple | None) -> None:
        if old == new:
            return
        if old is not None:
            rows = self.partitions[old[0]]
            del rows[bisect.bisect_left(rows, old[1])]
            if not rows:
                del self.partitions[old[0]]
        if new is not None:
            bisect.insort(self.partitions.setdefault(new[0], []), new[1])


class Table:
    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.name = spec["TableName"]
        self.key = next(k["AttributeName"] for k in spec["KeySchema"] if k["KeyType"] == "HASH")
        self.items: dict[Any, dict] = {}
        self.sizes: dict[Any, int] = {}
        self.order: list[Any] = []  # every key, sorted: what a Scan walks
        self._marshalled: dict[Any, dict] = {}  # pk -> the item as the wire has it, until it changes
        self._entry_sizes: dict[tuple[str, Any], int] = {}  # (index, pk) -> its entry's size
        self.indexes = {i["IndexName"]: Index(self.name, i, self.key) for i in spec.get("GlobalSecondaryIndexes", [])}

    def write_cost(self, pk: Any, old: dict | None, new: dict | None, *, factor: int = 1) -> dict:
        """The write units this change costs, by partition."""
        new_size = item_size(new) if new is not None else 0
        cost = {(self.name, pk): factor * write_units(self.sizes.get(pk, 0), new_size)}
        for index in self.indexes.values():
            ok, nk = index.key_of(old, pk), index.key_of(new, pk)
            if ok is None and nk is None:
                continue
            if ok is not None and nk is not None and ok[0] == nk[0] and index.entry(old) == index.entry(new):
                continue
            if ok is not None and (nk is None or ok[0] != nk[0]):
                cost[(index.where, ok[0])] = cost.get((index.where, ok[0]), 0) + 1
            if nk is not None:
                units = write_units(item_size(index.entry(new)) + INDEX_OVERHEAD_BYTES)
                cost[(index.where, nk[0])] = cost.get((index.where, nk[0]), 0) + units
        return cost

    def wire(self, pk: Any, keep: tuple[str, ...] | None = None, index: Index | None = None) -> dict:
        """The item (or its index entry, or the attributes ``keep`` of either) marshalled."""
        names = index.projected if index is not None and index.projected is not None else None
        if keep is not None:
            names = keep if names is None else [k for k in keep if k in names]
        full = self._marshalled.get(pk)
        if full is None:
            item = self.items[pk]
            if len(self.items) >= WIRE_CACHE_ITEMS:  # not kept: only what is asked for
                return marshal(item) if names is None else {k: marshal_value(item[k]) for k in names if k in item}
            full = self._marshalled[pk] = marshal(item)  # a small table read over and over (the sessions)
        return full if names is None else {k: full[k] for k in names if k in full}

    def entry_size(self, index: Index, pk: Any) -> int:
        size = self._entry_sizes.get((index.name, pk))
        if size is None:
            size = self._entry_sizes[(index.name, pk)] = item_size(index.entry(self.items[pk])) + INDEX_OVERHEAD_BYTES
        return size

    def put(self, pk: Any, new: dict | None) -> None:
        old = self.items.get(pk)
        self._marshalled.pop(pk, None)
        for index in self.indexes.values():
            self._entry_sizes.pop((index.name, pk), None)
        for index in self.indexes.values():
            index.move(index.key_of(old, pk), index.key_of(new, pk))
        if new is None:
            if self.items.pop(pk, None) is not None:
                self.sizes.pop(pk, None)
                self.order.pop(bisect.bisect_left(self.order, pk))
            return
        if old is None:
            bisect.insort(self.order, pk)
        self.items[pk] = new
        self.sizes[pk] = item_size(new)


class Dynamo:
    """The client: ``Dynamo(partitions).create_table(**spec)``, then boto3's calls."""

    def __init__(self, partitions: Partitions) -> None:
        self.partitions = partitions
        self.tables: dict[str, Table] = {}
        self.calls: dict[str, int] = {}

    def create_table(self, **spec: Any) -> None:
        self.tables[spec["TableName"]] = Table(spec)

    def _table(self, name: str, op: str) -> Table:
        self.calls[op] = self.calls.get(op, 0) + 1
        try:
            return self.tables[name]
        except KeyError:
            raise _error("ResourceNotFoundException", f"no table {name}", op) from None

    def load(self, table: str, items: list[dict]) -> None:
        """Put items without charging or conditions: a run's starting state."""
        t = self.tables[table]
        for item in items:
            pk = item[t.key]
            for index in t.indexes.values():
                index.move(index.key_of(t.items.get(pk), pk), index.key_of(item, pk))
            t.items[pk] = item
            t.sizes[pk] = item_size(item)
        t.order = sorted(t.items)

    # --- single items ----------------------------------------------------------------------

    def get_item(self, *, TableName: str, Key: Mapping, ConsistentRead: bool = False, ProjectionExpression: str | None = None,
                 ExpressionAttributeNames: Mapping | None = None) -> dict:
        t = self._table(TableName, "GetItem")
        pk = unmarshal_value(Key[t.key])
        try:
            self.partitions.charge({}, {(t.name, pk): read_units(t.sizes.get(pk, 0), consistent=ConsistentRead)})
        except Throttled as exc:
            raise _throttled(exc, "GetItem") from None
        if pk not in t.items:
            return {}
        return {"Item": t.wire(pk, ex.projection(ProjectionExpression, ExpressionAttributeNames))}

    def put_item(self, *, TableName: str, Item: Mapping, ConditionExpression: str | None = None,
                 ExpressionAttributeNames: Mapping | None = None, ExpressionAttributeValues: Mapping | None = None,
                 ReturnValuesOnConditionCheckFailure: str = "NONE") -> dict:
        t = self._table(TableName, "PutItem")
        new = unmarshal(Item)
        pk = new[t.key]
        self._write(t, pk, lambda old: new, ConditionExpression, ExpressionAttributeNames, ExpressionAttributeValues,
                    ReturnValuesOnConditionCheckFailure, "PutItem")
        return {}

    def update_item(self, *, TableName: str, Key: Mapping, UpdateExpression: str, ConditionExpression: str | None = None,
                    ExpressionAttributeNames: Mapping | None = None, ExpressionAttributeValues: Mapping | None = None,
                    ReturnValues: str = "NONE", ReturnValuesOnConditionCheckFailure: str = "NONE") -> dict:
        t = self._table(TableName, "UpdateItem")
        pk = unmarshal_value(Key[t.key])
        apply = ex.update(UpdateExpression, ExpressionAttributeNames)
        values = unmarshal(ExpressionAttributeValues)

        def change(old: dict | None) -> dict:
            new = {t.key: pk, **(old or {})}
            apply(new, values)
            return new

        old, new = self._write(t, pk, change, ConditionExpression, ExpressionAttributeNames, ExpressionAttributeValues,
                               ReturnValuesOnConditionCheckFailure, "UpdateItem")
        if ReturnValues == "ALL_NEW":
            return {"Attributes": marshal(new)}
        if ReturnValues == "ALL_OLD" and old is not None:
            return {"Attributes": marshal(old)}
        return {}

    def delete_item(self, *, TableName: str, Key: Mapping, ConditionExpression: str | None = None,
                    ExpressionAttributeNames: Mapping | None = None, ExpressionAttributeValues: Mapping | None = None,
                    ReturnValuesOnConditionCheckFailure: str = "NONE") -> dict:
        t = self._table(TableName, "DeleteItem")
        pk = unmarshal_value(Key[t.key])
        self._write(t, pk, lambda old: None, ConditionExpression, ExpressionAttributeNames, ExpressionAttributeValues,
                    ReturnValuesOnConditionCheckFailure, "DeleteItem")
        return {}

    def _write(self, t: Table, pk: Any, change: Any, condition: str | None, names: Mapping | None, values: Mapping | None,
               on_failure: str, op: str) -> tuple[dict | None, dict | None]:
        old = t.items.get(pk)
        if condition and not ex.condition(condition, names)(old or {}, unmarshal(values)):
            try:
                self.partitions.charge({(t.name, pk): write_units(t.sizes.get(pk, 0))}, {})
            except Throttled as exc:
                raise _throttled(exc, op) from None
            extra = {"Item": marshal(old)} if on_failure == "ALL_OLD" and old is not None else {}
            raise _error("ConditionalCheckFailedException", "The conditional request failed", op, **extra)
        new = change(old)
        try:
            self.partitions.charge(t.write_cost(pk, old, new), {})
        except Throttled as exc:
            raise _throttled(exc, op) from None
        t.put(pk, new)
        return old, new

    # --- many items ----------------------------------------------------------------------------

    def batch_get_item(self, *, RequestItems: Mapping) -> dict:
        responses: dict[str, list] = {}
        for name, request in RequestItems.items():
            t = self._table(name, "BatchGetItem")
            keys = [unmarshal_value(k[t.key]) for k in request["Keys"]]
            if len(keys) > 100 or len(set(keys)) != len(keys):
                raise _error("ValidationException", "too many or repeated keys", "BatchGetItem")
            consistent = request.get("ConsistentRead", False)
            cost: dict = {}
            for pk in keys:
                cost[(t.name, pk)] = read_units(t.sizes.get(pk, 0), consistent=consistent)
            try:
                self.partitions.charge({}, cost)
            except Throttled as exc:
                raise _throttled(exc, "BatchGetItem") from None
            keep = ex.projection(request.get("ProjectionExpression"), request.get("ExpressionAttributeNames"))
            responses[name] = [t.wire(pk, keep) for pk in keys if pk in t.items]
        return {"Responses": responses, "UnprocessedKeys": {}}

    def query(self, *, TableName: str, KeyConditionExpression: str, IndexName: str | None = None,
              ExpressionAttributeNames: Mapping | None = None, ExpressionAttributeValues: Mapping | None = None,
              Limit: int | None = None, ExclusiveStartKey: Mapping | None = None, ScanIndexForward: bool = True,
              Select: str | None = None, ProjectionExpression: str | None = None, ConsistentRead: bool = False) -> dict:
        t = self._table(TableName, "Query")
        values = unmarshal(ExpressionAttributeValues)
        hash_attr, hash_value, sort = ex.key_condition(KeyConditionExpression, ExpressionAttributeNames, values)
        if IndexName is None:
            if hash_attr != t.key or sort is not None:
                raise _error("ValidationException", "query of the table by its hash key only", "Query")
            rows = [("", hash_value)] if hash_value in t.items else []
            where, index = t.name, None
        else:
            index = t.indexes[IndexName]
            if hash_attr != index.hash:
                raise _error("ValidationException", f"{IndexName} is keyed on {index.hash}", "Query")
            rows = index.partitions.get(hash_value, [])
            where = index.where
        lo, hi = 0, len(rows)
        if sort is not None:
            lo, hi = _sort_range(rows, *sort[1:])
            if lo is None:  # not all of one type with the bound: compared one by one
                rows = [r for r in rows if ex._compare(sort[1], r[0], sort[2])]
                lo, hi = 0, len(rows)
        if ExclusiveStartKey is not None:
            start = unmarshal(ExclusiveStartKey)
            mark = (start.get(index.range, "") if index and index.range else "", start[t.key])
            if ScanIndexForward:
                lo = max(lo, bisect.bisect_right(rows, mark, lo, hi))
            else:
                hi = min(hi, bisect.bisect_left(rows, mark, lo, hi))
        more = bool(Limit) and hi - lo > Limit
        if ScanIndexForward:
            page = rows[lo : lo + Limit if more else hi]
        else:
            page = rows[hi - Limit if more else lo : hi][::-1]
        keys = [pk for _, pk in page]
        size = sum(t.entry_size(index, pk) for pk in keys) if index else sum(t.sizes[pk] for pk in keys)
        try:
            self.partitions.charge({}, {(where, hash_value): read_units(size, consistent=ConsistentRead)})
        except Throttled as exc:
            raise _throttled(exc, "Query") from None
        out: dict[str, Any] = {"Count": len(page), "ScannedCount": len(page)}
        if Select != "COUNT":
            keep = ex.projection(ProjectionExpression, ExpressionAttributeNames)
            out["Items"] = [t.wire(pk, keep, index) for pk in keys]
        if more:
            last = t.items[keys[-1]]
            key = {t.key: last[t.key], **({index.hash: last[index.hash]} if index else {})}
            if index and index.range:
                key[index.range] = last[index.range]
            out["LastEvaluatedKey"] = marshal(key)
        return out

    def scan(self, *, TableName: str, Limit: int | None = None, ExclusiveStartKey: Mapping | None = None,
             ProjectionExpression: str | None = None, ExpressionAttributeNames: Mapping | None = None,
             Segment: int | None = None, TotalSegments: int | None = None, ConsistentRead: bool = False) -> dict:
        """A Scan in key order; a segment is a contiguous part of that order, as
        DynamoDB's segments are ranges of its hash order."""
        t = self._table(TableName, "Scan")
        lo, hi = 0, len(t.order)
        if TotalSegments:
            lo, hi = len(t.order) * Segment // TotalSegments, len(t.order) * (Segment + 1) // TotalSegments
        if ExclusiveStartKey is not None:
            lo = max(lo, bisect.bisect_right(t.order, unmarshal_value(ExclusiveStartKey[t.key])))
        end = min(hi, lo + Limit) if Limit else hi
        keys = t.order[lo:end]
        cost: dict = {}
        for pk in keys:  # a Scan reads many partitions: charged to each its item's part
            cost[(t.name, pk)] = read_units(t.sizes[pk], consistent=ConsistentRead)
        try:
            self.partitions.charge({}, cost)
        except Throttled as exc:
            raise _throttled(exc, "Scan") from None
        keep = ex.projection(ProjectionExpression, ExpressionAttributeNames)
        out: dict[str, Any] = {"Items": [t.wire(pk, keep) for pk in keys], "Count": len(keys)}
        if end < hi:
            out["LastEvaluatedKey"] = marshal({t.key: keys[-1]})
        return out

    def transact_write_items(self, *, TransactItems: list, ClientRequestToken: str | None = None) -> dict:
        """All or nothing: every condition is judged first; one that fails cancels the
        whole with a reason per entry (the old item where it asked for it)."""
        op = "TransactWriteItems"
        planned, reasons, failed = [], [], False
        for entry in TransactItems:
            (kind, body), = entry.items()
            t = self._table(body["TableName"], op)
            if kind == "Put":
                new_item = unmarshal(body["Item"])
                pk = new_item[t.key]
            else:
                pk = unmarshal_value(body["Key"][t.key])
            old = t.items.get(pk)
            values = unmarshal(body.get("ExpressionAttributeValues"))
            condition = body.get("ConditionExpression")
            if condition and not ex.condition(condition, body.get("ExpressionAttributeNames"))(old or {}, values):
                failed = True
                reason = {"Code": "ConditionalCheckFailed", "Message": "The conditional request failed"}
                if body.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" and old is not None:
                    reason["Item"] = marshal(old)
                reasons.append(reason)
                continue
            reasons.append({"Code": "None"})
            if kind == "Update":
                new = {t.key: pk, **(old or {})}
                ex.update(body["UpdateExpression"], body.get("ExpressionAttributeNames"))(new, values)
            elif kind == "Put":
                new = new_item
            elif kind == "Delete":
                new = None
            else:  # ConditionCheck: read, nothing written
                planned.append((t, pk, old, old, kind))
                continue
            planned.append((t, pk, old, new, kind))
        if len({(t.name, pk) for t, pk, *_ in planned}) != len(planned):
            raise _error("ValidationException", "a transaction touches one item twice", op)
        writes: dict = {}
        for t, pk, old, new, kind in planned:
            if kind == "ConditionCheck":
                writes[(t.name, pk)] = writes.get((t.name, pk), 0) + 2 * write_units(t.sizes.get(pk, 0))
                continue
            for key, units in t.write_cost(pk, old, new, factor=2).items():
                writes[key] = writes.get(key, 0) + units
        try:
            self.partitions.charge(writes, {})
        except Throttled:
            codes = [{"Code": "ThrottlingError", "Message": "throttled"} for _ in TransactItems]
            raise _error("TransactionCanceledException", "throttled", op, CancellationReasons=codes) from None
        if failed:
            raise _error("TransactionCanceledException", "a condition failed", op, CancellationReasons=reasons)
        for t, pk, _, new, kind in planned:
            if kind != "ConditionCheck":
                t.put(pk, new)
        return {}
