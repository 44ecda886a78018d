"""The small TAE engine (catalog, MVCC transactions, commit pipeline, WAL, checkpoint,
replay), one of several clients of logsvc. Not built yet: see the open issues."""
