"""The operations console at /console: its routes, signed sessions and templates."""
