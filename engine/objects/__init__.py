"""The storage building blocks of the engine's part 2 (issue 14): where column blocks live.

Modules, one idea each:

* `store`: the object store port (`ObjectStore`), `LocalDirStore` (the default, durable
  directory) and `MemoryObjectStore` (tests and the simulator, with fault injection).
* `s3`: `S3ObjectStore`, the port over S3 (the only module importing pyarrow's S3 client).
* `bloom`: the primary-key bloom filter; `zonemap`: per-column min/max/null counts and
  block pruning by a pyarrow expression.
* `blockfile`: L1 block and L2 segment objects (Parquet + our metadata in its footer);
  `deltafile`: persisted delete masks (deltaLoc).
* `cache`: the buffer cache, bounded by bytes, with pins.
* `errors`, `limits`: the typed errors and named bounds of all of the above.

Byte formats: engine/objects/FORMAT.md.
"""
