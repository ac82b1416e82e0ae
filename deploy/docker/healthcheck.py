"""The images' HEALTHCHECK: exit 0 when the server in this container answers ready, else 1.

The images have no curl; this uses only the standard library. The port follows
BATCHSERVE_HTTP_PORT as the server does, and proxy variables are ignored (the server is local).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

READY_PATH = "/v2/health/ready"


def main() -> int:
    url = f"http://127.0.0.1:{os.environ.get('BATCHSERVE_HTTP_PORT', '8000')}{READY_PATH}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
