"""The `sluice-journal` data source: `spark.read.format("sluice-journal").load(DIR)`.

One partition per data file (journal and archive), one row per record; no broker is involved.
The decoding is `sluice.spark.journal`; the schema is `JOURNAL_DDL` of `sluice.spark.schema`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructField, StructType

from sluice.spark.journal import JournalFile, journal_files, read_journal_file
from sluice.spark.options import JournalOptions, journal_options
from sluice.spark.schema import JOURNAL_COLUMNS
from sluice.spark.source import spark_type

__all__ = ["JournalFilePartition", "SluiceJournalDataSource", "SluiceJournalReader"]

logger = logging.getLogger(__name__)


def journal_schema() -> Any:
    """The schema of journal rows, built without asking the JVM to parse DDL."""
    return StructType([StructField(name, spark_type(kind)) for name, kind in JOURNAL_COLUMNS])


class JournalFilePartition(InputPartition):  # type: ignore[misc,unused-ignore]
    """One data file to read."""

    def __init__(self, journal_file: JournalFile) -> None:
        super().__init__(journal_file.name)
        self.journal_file = journal_file

    def __repr__(self) -> str:
        return f"JournalFilePartition({self.journal_file.name})"


class SluiceJournalDataSource(DataSource):  # type: ignore[misc,unused-ignore]
    """`format("sluice-journal")`: the records of a data directory's journal and archive."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "sluice-journal"

    def schema(self) -> Any:
        """One row per record."""
        return journal_schema()

    def reader(self, schema: Any) -> SluiceJournalReader:
        """A batch read of every data file under the path."""
        return SluiceJournalReader(journal_options(self.options))


class SluiceJournalReader(DataSourceReader):  # type: ignore[misc,unused-ignore]
    """Lists the files when the query is planned; each task decodes one."""

    def __init__(self, options: JournalOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        """One partition per data file, oldest first."""
        files = journal_files(self.options.path)
        logger.info("journal read of %s: %d files", self.options.path, len(files))
        return [JournalFilePartition(f) for f in files]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The records of one file, as Arrow record batches."""
        assert isinstance(partition, JournalFilePartition)
        return read_journal_file(
            partition.journal_file, fail_on_corruption=self.options.fail_on_corruption
        )
