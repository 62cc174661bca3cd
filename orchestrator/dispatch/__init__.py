"""Running nodes over the fleet: the Fleet (caps, leases, health, probes) and the rule that picks a backend (pick),
the Dispatcher (retries, failover; the journal answers what is done) and the journal itself (SQLite WAL) with its
schema (journal_schema) and its lock and files (journal_files)."""
