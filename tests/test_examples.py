"""The messaging examples in examples/messaging run against a real broker and print what the
docs say they print."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokerproc import BrokerProcess

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "messaging"

EXPECTED = {
    "queues.py": ["got order-1 customer 42", "redelivered order-2 True 2"],
    "transactions.py": [
        "committed debit\ncommitted credit\nnothing from the aborted transaction",
        "after ABORT invoice redelivered True",
        "after COMMIT the ACK holds",
    ],
    "dead_letters.py": ["dead letter too late", "because expired", "dead letter poison"],
    "priorities.py": ["order outage fire question routine"],
    "exclusive_and_groups.py": [
        "consumer a got alice-0 alice-1 alice-2",
        "consumer b got bob-0 bob-1 bob-2",
        "exclusive consumer a got one",
        "b took over and got one redelivered True",
        "one group at a time: a got X-0 X-1 Z-0",
        "one group at a time: b got Y-0",
    ],
    "dedup.py": ["delivered pay 10 EUR (attempt 0)", "no duplicate"],
    "durable.py": ["missed while away: ['101.5', '101.7']", "after deleting it: []"],
    "offsets.py": ["offsets [1, 2, 3, 4, 5]", "from offset 3 ['event 2', 'event 3', 'event 4']"],
    "wildcards_and_selectors.py": [
        "wildcard got ['ACME 12', 'IBM 140']",
        "selector got IBM 140",
        "nothing else matched",
    ],
}


@pytest.fixture(scope="module")
def example_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    workdir = tmp_path_factory.mktemp("examples")
    config = (EXAMPLES / "broker.toml").read_text() + '\n[store]\nkind = "memory"\n'
    broker = BrokerProcess(config, workdir).start()
    yield broker
    assert broker.stop() == 0


def test_every_example_is_checked() -> None:
    scripts = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example(example_broker: BrokerProcess, script: str) -> None:
    env = dict(os.environ, SLUICE_BROKER=f"127.0.0.1:{example_broker.port}")
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=EXAMPLES,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for line in EXPECTED[script]:
        assert line in result.stdout, (line, result.stdout)
