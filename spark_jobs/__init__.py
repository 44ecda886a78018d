"""PySpark jobs that replay and audit logsvc logs at scale. Not built yet: see the open
issues. Install with the `spark` extra."""
