"""Operating errors carried from a Spark task to the driver as JSON (spark_engine.per_log): a
task answers `describe(exc)`, the driver raises `rebuild(...)`, the same class with the same
message and fields (InputCorrupt's path and offset, ...), so a job fails on Spark as it does
on the local engine, not as Spark's wrapper of a Python traceback. Nothing is pickled: any
class of the spark_jobs.errors tree, including ones added later, crosses by name, its fields
as its attributes."""

from __future__ import annotations

from typing import Any

from spark_jobs.errors import SparkJobError


def describe(exc: SparkJobError) -> dict[str, Any]:
    return {"class": type(exc).__name__, "message": str(exc), "fields": dict(vars(exc))}


def rebuild(described: dict[str, Any]) -> SparkJobError:
    """The error `describe` described: its class when it is one of the tree's, else the base
    (a driver older than the task), with its message and fields."""
    found = error_classes().get(described["class"], SparkJobError)
    error: SparkJobError = found.__new__(found)
    Exception.__init__(error, described["message"])
    error.__dict__.update(described["fields"])
    return error


def error_classes() -> dict[str, type[SparkJobError]]:
    """Every class of the tree by name, found at run time (nothing to keep in step)."""
    found: dict[str, type[SparkJobError]] = {}
    pending: list[type[SparkJobError]] = [SparkJobError]
    while pending:
        cls = pending.pop()
        found[cls.__name__] = cls
        pending.extend(cls.__subclasses__())
    return found
