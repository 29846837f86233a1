"""PySpark data sources for Sluice (install with `pip install sluice[spark]`).

- `sluice`: `spark.readStream.format("sluice")` and `spark.read.format("sluice")` read a topic as
  a log of offsets with exactly-once replay; `df.write[Stream].format("sluice")` sends rows to
  destinations in broker transactions with deterministic dedup ids.
- `sluice-journal`: `spark.read.format("sluice-journal").load(DIR)` reads the journal and archive
  files of a data directory offline, one row per record.

Call `sluice.spark.register(spark)` once per session. The user guide is `docs/spark.md`.
"""

from __future__ import annotations

from typing import Any

from sluice.spark.registry import register_data_source

__all__ = ["register", "register_data_source"]


def register(spark: Any) -> None:
    """Register the `sluice` and `sluice-journal` data sources with a `SparkSession`."""
    # Imported here so that `import sluice.spark` works without pyspark installed.
    from sluice.spark.journal_source import SluiceJournalDataSource  # noqa: PLC0415
    from sluice.spark.source import SluiceDataSource  # noqa: PLC0415

    register_data_source(spark, SluiceDataSource)
    register_data_source(spark, SluiceJournalDataSource)
