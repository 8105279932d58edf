"""The way to the engine: admission queue, engine client, circuit breaker, engine pool, shared leases."""
