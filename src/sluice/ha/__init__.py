"""High availability: master/slave brokers on one store, by lease.

A broker with `[ha] role = "auto"` takes the lease on its store before it opens it, waiting as a
slave while another broker holds it; once master it renews the lease every `lease_s / 3`, and its
store checks the lease (`Fence.check`) before every write batch. A master that loses its lease
writes nothing more and exits at once. `Lease` is what every kind of lease offers;
`FileLease` is the lease on a shared data directory (the journal store).
"""

from sluice.ha.filelease import FileLease
from sluice.ha.lease import Lease, LeaseRecord

__all__ = ["FileLease", "Lease", "LeaseRecord"]
