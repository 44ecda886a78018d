"""An operating error met in a Spark task crosses to the driver as JSON
(error_transport.describe) and is raised there as its own class with its own message and
fields (error_transport.rebuild): every class of the tree survives the trip, InputCorrupt
and ObjectsUnreadable with their path, offset and reason."""

from __future__ import annotations

import json

import pytest

from spark_jobs import error_transport, errors
from spark_jobs.errors import InputCorrupt, ObjectsUnreadable, SparkJobError

EXAMPLES = [
    errors.BadInput("no log in the input"),
    errors.NotALog("/etc holds no WAL segment"),
    InputCorrupt("/wal/seg-1", 4096, "DSN 18: checksum mismatch"),
    errors.CopiesDisagree("DSN 3: two copies differ"),
    errors.LogHole("DSN 7 missing below safe DSN 9"),
    errors.ReplayRefused("TS older than the oldest checkpoint"),
    errors.ReplayFailed("table 2 unknown"),
    ObjectsUnreadable("data/2/a.parquet", "missing"),
]


@pytest.mark.parametrize("error", EXAMPLES)
def test_every_error_crosses_as_itself(error: SparkJobError) -> None:
    again = error_transport.rebuild(json.loads(json.dumps(error_transport.describe(error))))
    assert type(again) is type(error)
    assert str(again) == str(error)
    assert vars(again) == vars(error)


def test_the_tree_is_found_whole() -> None:
    classes = error_transport.error_classes()
    assert {type(e).__name__ for e in EXAMPLES} <= set(classes)
    assert classes["InputCorrupt"] is InputCorrupt and classes["SparkJobError"] is SparkJobError
