"""The command line, one module per command group; `main` is the `sluice` console script's entry
point and `python -m sluice`'s.

- `entry`: the parser of every command, and `main`;
- `exitcodes`: `ExitCode`, what every command exits with;
- `common`: what the groups share (client options, `UsageError`, the runner type);
- `broker`: `sluice broker`;
- `messages`: `sluice send` and `sluice recv`;
- `transfer`: `sluice put` and `sluice get` (with `getdir`, the receiving directory, and
  `progress`, the progress bar);
- `store`: `sluice store`, the offline journal tools;
- `bench`: `sluice bench`, the glue between its arguments and `sluice.bench`;
- `users`: `sluice user`, which edits the broker's users file.

Each group adds its subcommands with `add_parsers(sub)`, which returns their runners by name.
"""

from __future__ import annotations

from sluice.cli.entry import main

__all__ = ["main"]
