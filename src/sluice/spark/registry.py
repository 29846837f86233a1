"""Registering Python data sources so that several queries can use one at the same time.

PySpark's `spark.dataSource.register(cls)` wraps the class in one JVM `PythonFunction` whose
environment is a plain `java.util.HashMap`. Spark 4 hands that same map to every Python runner it
builds for the source (planning, reading, writing, commits, the streaming source process), and
each runner adds its settings to it with `put`, without a lock. When two queries start together
(a pipeline that reads a topic into Parquet and into a queue, say), two driver threads add keys at
once and the map's size stops matching its entries. From then on every task that carries the map
fails to deserialize (`java.io.OptionalDataException` in `HashMap.readObject`), for every later
query of the session that uses the source.

`register_data_source` registers the class the same way, but with a
`java.util.concurrent.ConcurrentHashMap`: concurrent puts are safe, and its serialized form does not
depend on a size read before the entries. It goes in two steps:

1. prepare: pickle the class, build the JVM function and data source objects, and find
   `DataSourceRegistration.registerPython(String, UserDefinedPythonDataSource)` by reflection.
   Nothing here changes the session, so if any of it fails (a Spark Connect session without a
   JVM, another PySpark release whose private hooks differ), the public call registers the class
   instead and a warning says why;
2. register: the one call that changes the session. Its errors are raised as they are, never
   answered with the public call: Spark refused the name, or the JVM went away mid-call and what
   it registered is unknown, and a second registration would only hide that.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

_DATA_SOURCE_CLASS = (
    "org.apache.spark.sql.execution.datasources.v2.python.UserDefinedPythonDataSource"
)
_REGISTER_METHOD = "registerPython"


def _preparation_errors() -> tuple[type[Exception], ...]:
    """What a missing or different private hook raises while the registration is prepared."""
    errors: tuple[type[Exception], ...] = (
        AttributeError,
        ImportError,
        NotImplementedError,
        TypeError,
    )
    try:
        # Imported here: absent where PySpark has no JVM gateway (a Spark Connect client).
        from py4j.protocol import (  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415
            Py4JError,
        )
    except ImportError:
        return errors
    return (*errors, Py4JError)


def register_data_source(spark: Any, source: type) -> None:
    """Register the data source class `source` with `spark`, safe for concurrent queries."""
    name = source.name()  # type: ignore[attr-defined]
    try:
        registration, data_source = _prepare(spark, source)
    except _preparation_errors() as exc:
        log.warning(
            "registering %s with the public API (%s: %s); queries started at the same time may "
            "hit Spark's unsynchronized data source environment",
            name,
            type(exc).__name__,
            exc,
        )
        spark.dataSource.register(source)
        return
    getattr(registration, _REGISTER_METHOD)(name, data_source)


def _prepare(spark: Any, source: type) -> tuple[Any, Any]:
    """(the JVM `DataSourceRegistration` of `spark`, the data source to give it); no changes."""
    jvm = spark.sparkContext._jvm
    wrapped = _wrap_with_concurrent_env(spark, source)
    data_source_class = getattr(jvm, _DATA_SOURCE_CLASS)
    data_source = data_source_class(wrapped)
    registration = spark._jsparkSession.dataSource()
    wanted = ["java.lang.String", _DATA_SOURCE_CLASS]
    for method in registration.getClass().getMethods():
        if (
            method.getName() == _REGISTER_METHOD
            and [p.getName() for p in method.getParameterTypes()] == wanted
        ):
            return registration, data_source
    raise AttributeError(f"no {_REGISTER_METHOD}({', '.join(wanted)}) on the session")


def _wrap_with_concurrent_env(spark: Any, source: type) -> Any:
    """The JVM `SimplePythonFunction` for `source`, as PySpark builds it, on a concurrent map."""
    from pyspark.core.rdd import _prepare_for_python_RDD  # noqa: PLC0415 - optional dependency

    sc = spark.sparkContext
    jvm = sc._jvm
    pickled, broadcast_vars, env, includes = _prepare_for_python_RDD(sc, source)
    concurrent_env = jvm.java.util.concurrent.ConcurrentHashMap(env)
    return jvm.SimplePythonFunction(
        bytearray(pickled),
        concurrent_env,
        includes,
        sc.pythonExec,
        sc.pythonVer,
        broadcast_vars,
        sc._javaAccumulator,
    )
