"""Front doors onto the job engine: each turns its protocol's request into one
:class:`~mortred_twisted.http.protocols.submission.Submission`, built once at the
edge; validation, admission, jobs, results and files are shared from there on.
The native job API (``POST /jobs``, :mod:`mortred_twisted.http.job_routes`) is the
first door (docs/protocols.md)."""
