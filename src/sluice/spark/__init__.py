"""PySpark data sources for Sluice (install with `pip install sluice[spark]`).

- `sluice`: `spark.readStream.format("sluice")` and `spark.read.format("sluice")` read a topic as
  a log of offsets with exactly-once replay; `df.write[Stream].format("sluice")` sends rows to
  destinations in broker transactions with deterministic dedup ids.
- `sluice-journal`: `spark.read.format("sluice-journal").load(DIR)` reads the journal and archive
  files of a data directory offline, one row per record.

Spark 4 finds both by itself (the `pyspark_sluice` and `pyspark_sluice_journal` packages, its
data source discovery); `sluice.spark.register(spark)` registers them for older setups and for
sessions that start several queries at once. The user guide is `docs/spark.md`.
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
