"""`clockq`, the operator's command line: clockq's HTTP API with a token, from any machine.

It is a client of the API and nothing else: it imports neither Django nor any of the server's
packages (an import-linter contract in pyproject.toml), so it installs on a laptop with its few
dependencies (click, rich, requests, PyYAML) and speaks to any clockq it can reach.
"""
