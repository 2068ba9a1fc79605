// Node.js: large ArrayBuffers (backing stores outside the JS heap) and a large JS heap of small
// objects; prints a SHA-256 of both. The JS heap size goes to stderr (not compared).
// Usage: node --max-old-space-size=1024 heap.js BUFFER_MIB OBJECTS
'use strict';
const crypto = require('crypto');
const bufferMib = Number(process.argv[2]);
const objects = Number(process.argv[3]);
const h = crypto.createHash('sha256');
const buffers = [];
for (let i = 0; i < bufferMib / 32; i++) {
  const b = new Float64Array(4 << 20);
  for (let j = 0; j < b.length; j++) b[j] = ((i * 1000003 + j) % 65521) * 0.5;
  buffers.push(b);
}
const objs = [];
for (let i = 0; i < objects; i++) objs.push({ id: i, name: 'key' + i, v: [i, i * 2, i % 97] });
let s = 0;
for (const o of objs) s = (s * 31 + o.v[2] + o.name.length + o.id) % 1000000007;
for (const b of buffers) h.update(Buffer.from(b.buffer));
h.update(String(s));
console.log('buffers=' + buffers.length + ' objects=' + objs.length + ' checksum=' + h.digest('hex'));
process.stderr.write('heap_used_mib=' + Math.round(process.memoryUsage().heapUsed / 1048576) + '\n');
