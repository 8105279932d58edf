"""The tiny random-weight vision-language model that the real vLLM CPU engine serves in contract tests.

``build.py`` runs with the engine venv's python (it needs torch and transformers, which the project's own
environment does not have); ``deploy.engine_cpu`` calls it and owns where the result goes.
"""
