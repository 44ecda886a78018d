"""Where the fields of the fast shape lie in an entry (engine/FORMAT.md, version 2): a
one-append transaction with one memo item and one AppendColumns command with one info. The
byte offsets (`_AT_*`), and the same fields as numpy record dtypes that read them for many
entries at once (`_SHAPE`: what the checks read; `_IDS`: what a decoded entry keeps).
"""

from __future__ import annotations

import numpy as np

# Where the fields of the fast shape lie in an entry (engine/FORMAT.md): header, start_ts,
# commit_ts, memo count, one memo item, command count, command head, db_id, table_id, info
# count, one info, then the AppendColumns body (rows, column count, definitions, columns).
_AT_MAGIC = 0
_AT_VERSION = 2
_AT_TYPE = 3
_AT_RESERVED = 4
_AT_BODY_LEN = 8
_AT_CHECKSUM = 12
_AT_START_TS = 20
_AT_COMMIT_TS = 28
_AT_MEMO_COUNT = 36
_AT_MEMO = 40  # db_id, table_id, block_id
_AT_CMD_COUNT = 64
_AT_CMD_TYPE = 68
_AT_CMD_LEN = 69
_AT_DB_ID = 73
_AT_TABLE_ID = 81
_AT_INFO_COUNT = 89
_AT_INFO = 93  # block_id u64, offset u32, rows u32
_AT_ROWS = 109
_AT_COLUMN_COUNT = 113
_AT_DEFINITIONS = 115
_CMD_BODY_AT = _AT_DB_ID  # the command's length counts the bytes from here to the end


_SHAPE = np.dtype(
    {
        "names": [
            "magic",
            "version",
            "type",
            "reserved",
            "body_len",
            "checksum",
            "start_ts",
            "commit_ts",
            "memo_count",
            "cmd_count",
            "cmd_type",
            "cmd_len",
            "info_count",
            "info_rows",
            "rows",
            "column_count",
        ],
        "formats": [
            "<u2",
            "u1",
            "u1",
            "<u4",
            "<u4",
            "<u8",
            "<u8",
            "<u8",
            "<u4",
            "<u4",
            "u1",
            "<u4",
            "<u4",
            "<u4",
            "<u4",
            "<u2",
        ],
        "offsets": [
            _AT_MAGIC,
            _AT_VERSION,
            _AT_TYPE,
            _AT_RESERVED,
            _AT_BODY_LEN,
            _AT_CHECKSUM,
            _AT_START_TS,
            _AT_COMMIT_TS,
            _AT_MEMO_COUNT,
            _AT_CMD_COUNT,
            _AT_CMD_TYPE,
            _AT_CMD_LEN,
            _AT_INFO_COUNT,
            _AT_INFO + 12,
            _AT_ROWS,
            _AT_COLUMN_COUNT,
        ],
        "itemsize": _AT_DEFINITIONS,
    }
)
"""The fixed fields of the fast shape, as one numpy record per entry."""


_IDS = np.dtype(
    {
        "names": ["start_ts", "commit_ts", "memo", "db_id", "table_id", "block_id", "offset"],
        "formats": ["<u8", "<u8", ("<u8", (3,)), "<u8", "<u8", "<u8", "<u4"],
        "offsets": [
            _AT_START_TS,
            _AT_COMMIT_TS,
            _AT_MEMO,
            _AT_DB_ID,
            _AT_TABLE_ID,
            _AT_INFO,
            _AT_INFO + 8,
        ],
        "itemsize": _AT_DEFINITIONS,
    }
)
"""The ids and timestamps of the fast shape that a decoded entry keeps, one record per entry."""
