"""Verifies webhook requests as a consumer would, with Standard Webhooks' own library.

Reads one JSON object a line, {"secret", "headers", "body"}, and writes one a line:
{"ok": true, "type": ..., "id": ...} when `standardwebhooks.Webhook(secret).verify(body,
headers)` accepts it, else {"ok": false, "error": ...}.
"""

import json
import sys

from standardwebhooks import Webhook

for line in sys.stdin:
    request = json.loads(line)
    try:
        event = Webhook(request["secret"]).verify(request["body"], request["headers"])
        print(json.dumps({"ok": True, "type": event["type"], "id": request["headers"]["webhook-id"]}))
    except Exception as error:  # the verdict is the output, whatever refused it
        print(json.dumps({"ok": False, "error": f"{type(error).__name__}: {error}"}))
    sys.stdout.flush()
