"""`async def` tests in this directory run under `asyncio.run` with a time limit."""

from __future__ import annotations

import asyncio
import inspect

import pytest

TEST_TIMEOUT_S = 20.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    async def run() -> None:
        async with asyncio.timeout(TEST_TIMEOUT_S):
            await pyfuncitem.obj(**kwargs)

    asyncio.run(run())
    return True
