"""The gateway: routing, URL rewriting, API keys, rate limits (pure) and the upstream
client (reactor layer). The Klein edge lives in :mod:`mortred_twisted.http.gateway`."""
