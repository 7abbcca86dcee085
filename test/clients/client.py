"""The gRPC C-core client of the client matrix (matrix_test.go), through
Debian's python3-grpcio: it calls whoami at the xds:/// target in argv[1],
with the bootstrap named by GRPC_XDS_BOOTSTRAP, one call at a time,
SCOPEPLANE_CALL_INTERVAL_MS (100 unless set) after the last one ended, each
with a deadline of SCOPEPLANE_CALL_DEADLINE_MS (1000 unless set); every
other call carries the metadata x-canary: yes. It prints one JSON line per
call: {"backend": "<name>", "canary": <bool>, "ms": <elapsed>} or
{"error": "<code>: <details>", "code": "<code>", "canary": <bool>,
"ms": <elapsed>}. It runs until killed."""
import json
import os
import sys
import time

import grpc


def deserialize(buf):
    """Decodes a google.protobuf.StringValue: field 1, a length-prefixed string."""
    if not buf:
        return ""
    if buf[0] != 0x0A:
        raise ValueError("not a StringValue")
    length, shift, i = 0, 0, 1
    while i < len(buf):
        b = buf[i]
        i += 1
        length |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return buf[i:i + length].decode("utf-8")


def main():
    interval = float(os.environ.get("SCOPEPLANE_CALL_INTERVAL_MS", "100")) / 1000
    deadline = float(os.environ.get("SCOPEPLANE_CALL_DEADLINE_MS", "1000")) / 1000
    channel = grpc.insecure_channel(sys.argv[1])
    get = channel.unary_unary("/scopeplane.whoami.Whoami/Get",
                              request_serializer=lambda _: b"",
                              response_deserializer=deserialize)
    canary = False
    while True:
        canary = not canary
        metadata = [("x-canary", "yes")] if canary else None
        start = time.monotonic()
        try:
            out = {"backend": get(None, timeout=deadline, metadata=metadata)}
        except grpc.RpcError as err:
            out = {"error": "%s: %s" % (err.code().name, err.details()), "code": err.code().name}
        out["canary"] = canary
        out["ms"] = round((time.monotonic() - start) * 1000)
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
        time.sleep(interval)


if __name__ == "__main__":
    main()
