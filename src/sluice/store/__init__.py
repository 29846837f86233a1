"""Message stores: the interface (`api`), the in-memory reference store and the journal store."""
