"""The PostgreSQL message store (`store.PostgresStore`), its schema and its writer."""
