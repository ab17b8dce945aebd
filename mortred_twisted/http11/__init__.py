"""HTTP/1.1 on llhttp, below everything of ours that speaks HTTP (imports nothing else
of the project): the server (connections, factory, decisions from the head, deadlines,
budgets, write flow control), its request and answer types, the upstream client
(pooled requests and streams), the SSE codec, bearer-token helpers and the rate
limiter. The model API, the gateway and the supervisor are apps served by it."""
