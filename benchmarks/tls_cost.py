"""The cost of TLS: throughput over a plain and a TLS listener of one broker, and the rate of
TLS handshakes.

Makes a CA and a server certificate with the `openssl` commands of docs/security.md, starts
`sluice broker` with a plain and a TLS `[[listeners]]`, then runs `sluice bench throughput` over
each, interleaved (plain, TLS, plain, TLS, ...), and prints the medians of the throughput and of
the broker's CPU time per message (read from /proc: steadier than throughput on a shared
machine), and their ratios. Then it
opens `--connections` connections over each listener, `--concurrency` at a time, each a TCP
connect, the TLS handshake (for TLS), STOMP CONNECT/CONNECTED and a close, and prints
connections per second.

    .venv/bin/python benchmarks/tls_cost.py --count 200000 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sluice.bench.stomplink import BrokerTarget, open_link

LISTENING = re.compile(r"listening on [\d.]+:(\d+), [\d.]+:(\d+) \(tls\)")


def make_certificates(directory: Path) -> None:
    """A CA and a server certificate for 127.0.0.1 and localhost, as in docs/security.md."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "3650",
        "-subj",
        "/CN=Sluice test CA",
    )
    openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    )
    (directory / "server.ext").write_text(
        "subjectAltName = DNS:localhost, IP:127.0.0.1\nextendedKeyUsage = serverAuth\n"
    )
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "825",
        "-extfile",
        "server.ext",
    )


def start_broker(directory: Path) -> tuple[subprocess.Popen[str], int, int]:
    config = directory / "sluice.toml"
    config.write_text(
        '[[listeners]]\nhost = "127.0.0.1"\nport = 0\n\n'
        '[[listeners]]\nhost = "127.0.0.1"\nport = 0\n'
        'tls = { cert = "server.pem", key = "server.key" }\n'
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluice",
            "broker",
            "--config",
            str(config),
            "--store",
            "journal",
            "--data",
            str(directory / "data"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        match = LISTENING.search(line)
        if match:
            return proc, int(match.group(1)), int(match.group(2))
    raise RuntimeError("the broker did not start")


def throughput(
    port: int, tls_args: list[str], count: int, out: Path, broker_pid: int
) -> tuple[float, float]:
    """One run: (messages per second, broker CPU microseconds per message)."""
    command = [
        sys.executable,
        "-m",
        "sluice",
        "bench",
        "throughput",
        "--producers",
        "1",
        "--consumers",
        "1",
        "--size",
        "1024",
        "--count",
        str(count),
        "--broker",
        f"127.0.0.1:{port}",
        "--broker-pid",
        str(broker_pid),
        "--json",
        str(out),
        *tls_args,
    ]
    subprocess.run(command, check=True, capture_output=True)
    results = json.loads(out.read_text())["results"]
    return float(results["messages_per_s"]), float(
        results["cpu"]["measured"]["broker"]["us_per_msg"]
    )


async def _connections(target: BrokerTarget, total: int, concurrency: int) -> float:
    pending = iter(range(total))

    async def worker() -> None:
        for index in pending:
            link = await open_link(target, f"conn {index}", 30.0)
            link.close()
            await link.wait_closed()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200_000, help="messages per throughput run")
    parser.add_argument("--runs", type=int, default=3, help="runs over each listener")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    if shutil.which("openssl") is None:
        sys.exit("needs the openssl command")
    directory = Path(tempfile.mkdtemp(prefix="sluice-tls-"))
    make_certificates(directory)
    proc, plain_port, tls_port = start_broker(directory)
    try:
        tls_args = ["--tls", "--ca", str(directory / "ca.pem")]
        plain: list[tuple[float, float]] = []
        tls: list[tuple[float, float]] = []
        for run in range(args.runs):
            plain.append(throughput(plain_port, [], args.count, directory / "p.json", proc.pid))
            tls.append(throughput(tls_port, tls_args, args.count, directory / "t.json", proc.pid))
            print(
                f"run {run + 1}: plain {plain[-1][0]:,.0f} msg/s {plain[-1][1]:.1f} us/msg, "
                f"tls {tls[-1][0]:,.0f} msg/s {tls[-1][1]:.1f} us/msg"
            )
        p = statistics.median(r[0] for r in plain)
        t = statistics.median(r[0] for r in tls)
        print(f"throughput median: plain {p:,.0f} msg/s, tls {t:,.0f} msg/s, tls/plain {t / p:.2f}")
        p = statistics.median(r[1] for r in plain)
        t = statistics.median(r[1] for r in tls)
        print(f"broker CPU median: plain {p:.1f} us/msg, tls {t:.1f} us/msg, tls/plain {t / p:.2f}")
        plain_target = BrokerTarget("127.0.0.1", plain_port)
        tls_target = BrokerTarget("127.0.0.1", tls_port, ca=str(directory / "ca.pem"))
        for name, target in (("plain", plain_target), ("tls", tls_target)):
            rate = asyncio.run(_connections(target, args.connections, args.concurrency))
            print(f"connections ({name}, {args.concurrency} at a time): {rate:,.0f}/s")
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
