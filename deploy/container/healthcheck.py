#!/opt/venv/bin/python
"""The image's HEALTHCHECK: GET ``$MORTRED_HEALTH_URL`` (the gateway's ``/healthz``
by default; a model server's container sets ``http://127.0.0.1:<port>/ready``), healthy
on a 2xx within 2 s. Exit 0 healthy, 1 not (the status or error on stdout)."""

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    url = os.environ.get("MORTRED_HEALTH_URL") or "http://127.0.0.1:8080/healthz"
    try:
        with urllib.request.urlopen(url, timeout=2.0) as answer:
            print(f"{url}: {answer.status}")
            return 0 if 200 <= answer.status < 300 else 1
    except urllib.error.HTTPError as exc:
        print(f"{url}: {exc.code}")
    except (OSError, ValueError) as exc:
        print(f"{url}: {exc}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
