"""Running nodes over the fleet: the Fleet (caps, leases, health, probes), the Dispatcher (retries, failover; the
journal answers what is done) and the journal itself (SQLite WAL) with its schema."""
