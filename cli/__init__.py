"""The modgate command line: serve, the engine simulator, keys, policy, cache and stats tools."""
