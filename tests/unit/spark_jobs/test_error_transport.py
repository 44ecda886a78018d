"""An operating error met in a Spark task crosses to the driver as JSON (errors.describe) and
is raised there as its own class with its own fields (errors.rebuild): every class of the
tree survives the trip, InputCorrupt and ObjectsUnreadable with their path, offset and reason."""

from __future__ import annotations

import json

import pytest

from spark_jobs import errors
from spark_jobs.errors import InputCorrupt, ObjectsUnreadable, SparkJobError


@pytest.mark.parametrize(
    "error",
    [
        errors.BadInput("no log in the input"),
        errors.NotALog("/etc holds no WAL segment"),
        InputCorrupt("/wal/seg-1", 4096, "DSN 18: checksum mismatch"),
        errors.CopiesDisagree("DSN 3: two copies differ"),
        errors.LogHole("DSN 7 missing below safe DSN 9"),
        errors.ReplayRefused("TS older than the oldest checkpoint"),
        errors.ReplayFailed("table 2 unknown"),
        ObjectsUnreadable("data/2/a.parquet", "missing"),
    ],
)
def test_every_error_crosses_as_itself(error: SparkJobError) -> None:
    again = errors.rebuild(json.loads(json.dumps(errors.describe(error))))
    assert type(again) is type(error)
    assert str(again) == str(error)
    assert vars(again) == vars(error)


def test_the_tree_is_listed_whole() -> None:
    """A class added to errors.py without a place in `ERROR_CLASSES` would come back as the base."""
    assert set(errors.ERROR_CLASSES) == set(SparkJobError.__subclasses__())
