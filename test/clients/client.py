"""The gRPC C-core client of the client matrix (matrix_test.go), through
Debian's python3-grpcio: it calls whoami at the xds:/// target in argv[1],
with the bootstrap named by GRPC_XDS_BOOTSTRAP, every 100 ms, and prints one
JSON line per call: {"backend": "<name>"} or {"error": "<status>"}. It runs
until killed."""
import json
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
    channel = grpc.insecure_channel(sys.argv[1])
    get = channel.unary_unary("/scopeplane.whoami.Whoami/Get",
                              request_serializer=lambda _: b"",
                              response_deserializer=deserialize)
    while True:
        try:
            out = {"backend": get(None, timeout=1)}
        except grpc.RpcError as err:
            out = {"error": "%s: %s" % (err.code().name, err.details())}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
        time.sleep(0.1)


if __name__ == "__main__":
    main()
