"""Typed errors of the object layer: the store port, the codecs, the buffer cache.

Why a tree (shared/STYLE.md "Two kinds of failure"; httpx draws its tree the same way): the
engine acts differently on each branch. It retries a flush later after
`ObjectStoreUnavailable`, stops flushing and alerts after `ObjectStoreFailed`, treats
`ObjectNotFound` of a referenced object as lost data, and `ObjectCorrupt` as damage to report
with the object's name. Programmer errors (a broken invariant) are `assert`s, not listed.

The tree::

    EngineError                         (engine/errors.py)
    ├── Overloaded                      (engine/errors.py)
    │   └── CacheFull                   every byte of the buffer cache is pinned
    └── ObjectsError
        ├── ObjectStoreError            a store operation failed; `description` names the store
        │   ├── BadObjectName           not a valid object name (the request, not the store)
        │   ├── BadObjectRange          a byte range outside the object
        │   ├── ObjectNotFound          no object of that name
        │   ├── ObjectExists            put of an existing name with other bytes (immutable)
        │   ├── ObjectStoreUnavailable  transient: refused, reset, timeout, 5xx, throttled;
        │   │                           raised after the bounded retries; retry later
        │   └── ObjectStoreFailed       permanent: permission, missing bucket, I/O error
        │       └── ObjectStoreFull     no space left (ENOSPC, EDQUOT)
        ├── ObjectCorrupt               an object's bytes do not decode as its format says
        └── RowsNotSorted               a block writer was handed rows out of key order
"""

from __future__ import annotations

from engine.errors import EngineError, Overloaded


class ObjectsError(EngineError):
    """Base of every error raised by engine.objects."""


class ObjectStoreError(ObjectsError):
    """A store operation failed. `description` is the store's ("dir:/path", "s3://b/p"),
    `name` the object's (empty when the operation names none, e.g. a list)."""

    def __init__(self, description: str, name: str, detail: str) -> None:
        what = f"{description} object {name!r}" if name else description
        super().__init__(f"{what}: {detail}")
        self.description = description
        self.name = name
        self.detail = detail


class BadObjectName(ObjectStoreError):
    """The name breaks the naming rules (store.py `check_name`), or collides with the
    directory of another object on a store that has directories."""


class BadObjectRange(ObjectStoreError):
    """`get_range` asked for bytes outside the object: `offset + length > size`."""

    def __init__(
        self, description: str, name: str, offset: int, length: int, size_bytes: int
    ) -> None:
        super().__init__(
            description,
            name,
            f"range [{offset}, {offset + length}) is outside the object of {size_bytes} bytes",
        )
        self.offset = offset
        self.length = length
        self.size_bytes = size_bytes


class ObjectNotFound(ObjectStoreError):
    def __init__(self, description: str, name: str, detail: str = "no such object") -> None:
        super().__init__(description, name, detail)


class ObjectExists(ObjectStoreError):
    """Objects are immutable: a put of an existing name with different bytes is refused (the
    same bytes again is a retried put and succeeds)."""

    def __init__(self, description: str, name: str) -> None:
        super().__init__(description, name, "exists with different bytes (objects are immutable)")


class ObjectStoreUnavailable(ObjectStoreError):
    """Transient: the store did not answer or answered "try later". Raised after the store's
    own bounded retries. A put that raised this may or may not have stored the object: a
    retry of the same bytes is safe (it is a no-op if the first one landed)."""


class ObjectStoreFailed(ObjectStoreError):
    """Permanent: retrying the same request will fail the same way until an operator acts."""


class ObjectStoreFull(ObjectStoreFailed):
    """No space left on the device, or a quota reached."""


class ObjectCorrupt(ObjectsError):
    """Object `name` does not decode: `reason` names the check that failed (one of the
    REASON_* strings of the codec), `offset_bytes` where, when known (an offset in the
    object, or in the serialized structure the reason names)."""

    def __init__(self, name: str, reason: str, offset_bytes: int | None = None) -> None:
        where = f" at byte {offset_bytes}" if offset_bytes is not None else ""
        super().__init__(f"object {name!r}: {reason}{where}")
        self.name = name
        self.reason = reason
        self.offset_bytes = offset_bytes


class RowsNotSorted(ObjectsError):
    """The rows given to a block writer are not strictly increasing by primary key (unsorted,
    or a key repeated). Nothing was written. `row` is the first offending row."""

    def __init__(self, row: int, detail: str) -> None:
        super().__init__(f"row {row}: {detail}")
        self.row = row


class CacheFull(Overloaded):
    """The buffer cache cannot take an entry of `size_bytes`: every byte that could be freed
    is pinned (or the entry alone is larger than the cache). Unpin, then retry."""

    def __init__(self, size_bytes: int, capacity_bytes: int, pinned_bytes: int) -> None:
        super().__init__("buffer cache", capacity_bytes)
        self.args = (
            f"buffer cache cannot take {size_bytes} bytes: "
            f"{pinned_bytes} of {capacity_bytes} bytes are pinned",
        )
        self.size_bytes = size_bytes
        self.capacity_bytes = capacity_bytes
        self.pinned_bytes = pinned_bytes
