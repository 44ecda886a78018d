"""Spark jobs over the engine's WAL and logsvc's segment files (issue 16): replay as of a
timestamp, LSN audit, replica diff, write statistics, transaction latency, inventory.

`python -m spark_jobs JOB ...` (spark_jobs/__main__.py); the Data Sources `tae_wal` and
`logsvc_segments` (sources.py); the readers every engine shares (walread.py, journal.py);
`--engine local` runs the same jobs on pyarrow alone (local.py). pyspark is imported only
by session.py, sources.py and spark_engine.py, and only when the Spark engine runs.
"""
