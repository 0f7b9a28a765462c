"""A real SMTP server (aiosmtpd) that misbehaves on purpose, driven by the tests.

Each message the server is given (its DATA) is logged as one JSON line to --log, with
what the server did with it; then, depending on the options, counted over the messages
received so far:

  --drop N      the first N: keep the message, then drop the connection before the 250
                (the lost acknowledgement: the server has it, the client cannot know)
  --tempfail N  the first N: answer 451 (not accepted; try again later)
  --permfail    every one: answer 550 (not accepted, never will be)
  --hold N      the first N: keep the message and never answer (until the client dies)

Anything else is accepted with 250. It prints "listening on PORT" once it listens on
127.0.0.1 (port 0 picks a free one).

The tests need these faults and maildev cannot make them; everything else they check
against maildev.
"""

import argparse
import asyncio
import json
import sys

from aiosmtpd.smtp import SMTP


class Handler:
    def __init__(self, args):
        self.args = args
        self.received = 0

    def log(self, envelope, outcome):
        message_id = None
        for line in envelope.content.split(b"\r\n"):
            if line == b"":
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"message-id":
                message_id = value.strip().decode()
        with open(self.args.log, "a") as log:
            log.write(json.dumps({
                "message_id": message_id,
                "outcome": outcome,
                "from": envelope.mail_from,
                "to": envelope.rcpt_tos,
            }) + "\n")

    async def handle_DATA(self, server, session, envelope):
        self.received += 1
        n = self.received
        if n <= self.args.drop:
            self.log(envelope, "dropped")
            server.transport.abort()
            return "250 OK (never sent: the connection is gone)"
        if n <= self.args.tempfail:
            self.log(envelope, "tempfail")
            return "451 4.3.0 try again later"
        if self.args.permfail:
            self.log(envelope, "permfail")
            return "550 5.1.1 mailbox unavailable"
        if n <= self.args.hold:
            self.log(envelope, "held")
            await asyncio.Event().wait()
        self.log(envelope, "accepted")
        return "250 OK"


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", required=True)
    parser.add_argument("--drop", type=int, default=0)
    parser.add_argument("--tempfail", type=int, default=0)
    parser.add_argument("--permfail", action="store_true")
    parser.add_argument("--hold", type=int, default=0)
    args = parser.parse_args()
    handler = Handler(args)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: SMTP(handler, hostname="faulty.test"), "127.0.0.1", args.port
    )
    port = server.sockets[0].getsockname()[1]
    print(f"listening on {port}", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
