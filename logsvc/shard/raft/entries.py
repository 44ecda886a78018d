"""The journal entry format as offline readers see it (`logsvc doctor`-style tools, the Spark
jobs): what kind an entry is and the command bytes of a regular one, read with an unpickler
that refuses every global. Imports no pysyncobj (spark_jobs/journal.py runs on executors).
An entry is pysyncobj's encoding of one call: a type byte, then a pickle."""

from __future__ import annotations

import io
import pickle
from typing import Any

COMMAND_TYPE_REGULAR = 0
COMMAND_TYPE_MEMBERSHIP = 2


class JournalEntryUndecodable(ValueError):
    """An offline reader met a journal entry whose regular-command wrapping is not the
    `(method id, (command bytes,))` pickle this module writes."""


JOURNAL_ENTRY_REGULAR = "regular"
JOURNAL_ENTRY_NOOP = "noop"
JOURNAL_ENTRY_MEMBERSHIP = "membership"
JOURNAL_ENTRY_VERSION = "version"
JOURNAL_ENTRY_UNKNOWN = "unknown"
_JOURNAL_ENTRY_KINDS = {
    COMMAND_TYPE_REGULAR: JOURNAL_ENTRY_REGULAR,
    1: JOURNAL_ENTRY_NOOP,  # pysyncobj _COMMAND_TYPE.NO_OP: a new leader's first entry
    COMMAND_TYPE_MEMBERSHIP: JOURNAL_ENTRY_MEMBERSHIP,
    3: JOURNAL_ENTRY_VERSION,  # pysyncobj _COMMAND_TYPE.VERSION: never proposed by logsvc
}


def journal_entry_kind(journal_payload: bytes) -> str:
    """What a journal entry is, from pysyncobj's type byte: a regular command (ours), a
    leader's no-op, a membership change, a code version, or unknown."""
    if not journal_payload:
        return JOURNAL_ENTRY_UNKNOWN
    return _JOURNAL_ENTRY_KINDS.get(journal_payload[0], JOURNAL_ENTRY_UNKNOWN)


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Unpickles only plain values: any class or function reference is refused. A regular
    entry holds `(int, (bytes,))`, which needs none."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a journal entry may not reference {module}.{name}")


def command_of_entry_offline(journal_payload: bytes) -> bytes | None:
    """`command_of_entry` for readers of journal files at rest (`logsvc doctor`-style tools,
    the Spark jobs): the same bytes out, but the pickle is read by an unpickler that refuses
    every global, so a tampered file on shared storage cannot run code in the reader. None
    for pysyncobj's own entries; `JournalEntryUndecodable` for a regular entry that is not
    the wrapping `_logsvc_apply` writes."""
    if journal_entry_kind(journal_payload) != JOURNAL_ENTRY_REGULAR:
        return None
    try:
        call = _NoGlobalsUnpickler(io.BytesIO(journal_payload[1:])).load()
    except Exception as exc:  # any unpickling failure: damage, or not our wrapping
        raise JournalEntryUndecodable(f"regular entry does not unpickle: {exc}") from None
    if not (
        isinstance(call, tuple)
        and len(call) == 2
        and isinstance(call[0], int)
        and isinstance(call[1], tuple)
        and len(call[1]) == 1
        and isinstance(call[1][0], bytes)
    ):
        raise JournalEntryUndecodable("regular entry is not (method id, (command bytes,))")
    return call[1][0]


# ------------------------------------------------------------------------ the journal
