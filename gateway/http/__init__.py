"""The HTTP edge: app factory, routes, shared services, errors in the OpenAI shape, API keys, console."""
