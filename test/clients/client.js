// The grpc-js-xds client of the client matrix (matrix_test.go): it calls
// whoami at the xds:/// target in argv[2], with the bootstrap named by
// GRPC_XDS_BOOTSTRAP, one call at a time, SCOPEPLANE_CALL_INTERVAL_MS
// (100 unless set) after the last one ended, each with a deadline of
// SCOPEPLANE_CALL_DEADLINE_MS (1000 unless set); every other call carries
// the metadata x-canary: yes. It prints one JSON line per call:
// {"backend": "<name>", "canary": <bool>, "ms": <elapsed>} or
// {"error": "<code>: <details>", "code": "<code>", "canary": <bool>, "ms": <elapsed>}.
// It runs until killed.
'use strict';
const grpc = require('@grpc/grpc-js');
require('@grpc/grpc-js-xds').register();

const target = process.argv[2];
const interval = Number(process.env.SCOPEPLANE_CALL_INTERVAL_MS || 100);
const deadlineMs = Number(process.env.SCOPEPLANE_CALL_DEADLINE_MS || 1000);
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
let canary = false;
function call() {
  canary = !canary;
  const md = new grpc.Metadata();
  if (canary) md.set('x-canary', 'yes');
  const start = Date.now();
  const deadline = new Date(start + deadlineMs);
  const sent = canary;
  client.makeUnaryRequest('/scopeplane.whoami.Whoami/Get', serialize, deserialize, null, md, { deadline }, (err, value) => {
    const ms = Date.now() - start;
    const out = err
      ? { error: `${grpc.status[err.code]}: ${err.details}`, code: grpc.status[err.code], canary: sent, ms }
      : { backend: value, canary: sent, ms };
    process.stdout.write(JSON.stringify(out) + '\n');
    setTimeout(call, interval);
  });
}
call();
