// The grpc-js-xds client of the client matrix (matrix_test.go): it calls
// whoami at the xds:/// target in argv[2], with the bootstrap named by
// GRPC_XDS_BOOTSTRAP, every 100 ms, and prints one JSON line per call:
// {"backend": "<name>"} or {"error": "<status>"}. It runs until killed.
'use strict';
const grpc = require('@grpc/grpc-js');
require('@grpc/grpc-js-xds').register();

const target = process.argv[2];
// whoami's request is google.protobuf.Empty (no bytes); its answer a
// google.protobuf.StringValue: field 1, a length-prefixed string.
const serialize = () => Buffer.alloc(0);
function deserialize(buf) {
  if (buf.length === 0) return '';
  if (buf[0] !== 0x0a) throw new Error('not a StringValue');
  let len = 0, shift = 0, i = 1;
  for (; i < buf.length; i++) {
    len |= (buf[i] & 0x7f) << shift;
    shift += 7;
    if ((buf[i] & 0x80) === 0) { i++; break; }
  }
  return buf.subarray(i, i + len).toString('utf8');
}

const client = new grpc.Client(target, grpc.credentials.createInsecure());
function call() {
  const deadline = new Date(Date.now() + 1000);
  client.makeUnaryRequest('/scopeplane.whoami.Whoami/Get', serialize, deserialize, {}, { deadline }, (err, value) => {
    process.stdout.write(JSON.stringify(err ? { error: `${grpc.status[err.code]}: ${err.details}` } : { backend: value }) + '\n');
    setTimeout(call, 100);
  });
}
call();
