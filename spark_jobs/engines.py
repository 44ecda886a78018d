"""Which engine runs a job: `--engine spark`, `local`, or `auto` (the default), decided from
the input's size. Pure; the CLI prints the choice and the manifest records it.

`auto` chooses Spark when the user named a cluster (`--master`), when spark-submit launched
us (the user chose Spark by launching it), or when the input holds at least
`limits.AUTO_SPARK_INPUT_BYTES_MIN` bytes; otherwise the local engine (pyarrow, one process,
no JVM), which is faster and lighter on logs that fit one machine (shared/reference/spark.md
§1.6, README "Measured").
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_jobs.limits import AUTO_SPARK_INPUT_BYTES_MIN

ENGINE_LOCAL = "local"
ENGINE_SPARK = "spark"
ENGINE_AUTO = "auto"
ENGINES = (ENGINE_SPARK, ENGINE_LOCAL)
ENGINE_CHOICES = (ENGINE_AUTO, ENGINE_SPARK, ENGINE_LOCAL)


@dataclass(frozen=True, slots=True)
class EngineChoice:
    engine: str  # ENGINE_SPARK or ENGINE_LOCAL
    requested: str  # what --engine said
    reason: str  # one line a person reads: why this engine


def choose_engine(
    requested: str, input_bytes: int, *, master: str | None, under_spark_submit: bool
) -> EngineChoice:
    assert requested in ENGINE_CHOICES
    assert input_bytes >= 0
    size = human_bytes(input_bytes)
    if requested != ENGINE_AUTO:
        return EngineChoice(requested, requested, f"--engine {requested} (input {size})")
    if under_spark_submit:
        reason = f"auto: launched by spark-submit (input {size})"
        return EngineChoice(ENGINE_SPARK, requested, reason)
    if master:
        return EngineChoice(ENGINE_SPARK, requested, f"auto: --master {master} (input {size})")
    threshold = human_bytes(AUTO_SPARK_INPUT_BYTES_MIN)
    if input_bytes >= AUTO_SPARK_INPUT_BYTES_MIN:
        return EngineChoice(
            ENGINE_SPARK, requested, f"auto: input {size} >= {threshold} (--engine local to force)"
        )
    return EngineChoice(
        ENGINE_LOCAL, requested, f"auto: input {size} < {threshold} (--engine spark to force)"
    )


def human_bytes(count: int) -> str:
    """1536 -> '1.5 KiB'; exact below 1 KiB."""
    assert count >= 0
    if count < 1024:
        return f"{count} B"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"
