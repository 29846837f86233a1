"""The journal store: rolling data files, group commit, an LMDB index, recovery, GC, tools."""
