"""The images' HEALTHCHECK: exit 0 when the server in this container answers 200 on /health.

/health needs no API key and answers 503 until the start-up models are loaded (see `portachat serve`)."""

import os
import sys
import urllib.error
import urllib.request

url = f"http://127.0.0.1:{os.environ.get('PORTACHAT_PORT', '8000')}/health"
try:
    with urllib.request.urlopen(url, timeout=4) as reply:
        sys.exit(0 if reply.status == 200 else 1)
except (OSError, urllib.error.URLError) as exc:
    print(f"{url}: {exc}", file=sys.stderr)
    sys.exit(1)
