// A js-libp2p client that joins a running pspnode job and checks its wire
// protocols against docs/protocols.md. Every message it sends or decodes is
// built from that document alone (section numbers below refer to it); the
// libp2p stack (TCP, Noise, yamux, identify, Kademlia, GossipSub) comes from
// the npm registry at the versions pinned in package.json.
//
// Checks: the worked examples; identify (section 4); a FIND_NODE lookup
// (9); two step queries on one stream (5, 6), in both versions of the step
// protocol (6.12: the lineage and model fields); a model fetch (7); a pool
// join, leave and stale join (8); GossipSub updates from both nodes (10);
// one invalid update published by the client, which both nodes reject,
// followed by valid ones they still take in (10.2, 10.5); and the step
// queries pspnode sends the client, which it answers with the leaving flag
// (6.3, 14).
//
// Configuration (environment):
//   PSP_JOB         job name
//   PSP_BOOTSTRAP   multiaddr of node A, ending in /p2p/<id>
//   PSP_STATUS      base URL of node A's HTTP interface (for /status)
//   PSP_TARGET      multiaddr of node B, ending in /p2p/<id>: the client
//                   looks B's peer ID up in A's DHT and checks that the
//                   lookup returns this address
//   PSP_TARGET_STATUS  base URL of node B's HTTP interface
//   PSP_MODEL       the model's "<name>|<shape>" string (section 7.5), for
//                   example "linreg|w[1x20] b[1x1]"
//   PSP_TIMEOUT_MS  overall deadline (default 45000)
//
// It prints one line per check and exits 0 when every check passed, 1
// otherwise. interop/interop_test.go starts the two nodes and runs it:
// `go test -run TestJSClient -v ./interop/` from the repository's root.

import './node20.mjs'
import { createHash } from 'node:crypto'
import { createLibp2p } from 'libp2p'
import { tcp } from '@libp2p/tcp'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { identify } from '@libp2p/identify'
import { ping } from '@libp2p/ping'
import { kadDHT, passthroughMapper } from '@libp2p/kad-dht'
import { gossipsub } from '@chainsafe/libp2p-gossipsub'
import { peerIdFromString } from '@libp2p/peer-id'
import { multiaddr } from '@multiformats/multiaddr'
import { byteStream } from 'it-byte-stream'

const env = process.env
for (const k of ['PSP_JOB', 'PSP_BOOTSTRAP', 'PSP_STATUS', 'PSP_TARGET', 'PSP_TARGET_STATUS', 'PSP_MODEL']) {
  if (!env[k]) {
    console.error(`missing ${k}`)
    process.exit(2)
  }
}
const job = env.PSP_JOB
const bootAddr = multiaddr(env.PSP_BOOTSTRAP)
const bootId = peerIdFromString(bootAddr.getPeerId())
const targetAddr = multiaddr(env.PSP_TARGET)
const targetId = peerIdFromString(targetAddr.getPeerId())
const statusURL = {
  [bootId.toString()]: env.PSP_STATUS.replace(/\/$/, '') + '/status',
  [targetId.toString()]: env.PSP_TARGET_STATUS.replace(/\/$/, '') + '/status'
}
const timeoutMs = Number(env.PSP_TIMEOUT_MS ?? 45000)

// Section 3: protocol IDs and the topic.
const proto = {
  step: `/psp/${job}/step/1.0.0`,
  step11: `/psp/${job}/step/1.1.0`,
  model: `/psp/${job}/model/2.0.0`,
  pool: `/psp/${job}/pool/1.0.0`,
  kad: `/psp/${job}/kad/1.0.0`
}
const topic = `psp/${job}/updates/1`

// Section 7.5: model id = first 4 bytes (big-endian) of SHA-256 of
// "<name>|<shape>"; the parameter count is the sum of the tensors' sizes.
function modelIdOf (spec) {
  return createHash('sha256').update(spec, 'ascii').digest().readUInt32BE(0)
}
const modelSpec = env.PSP_MODEL
const modelId = modelIdOf(modelSpec)
const nParams = [...modelSpec.split('|')[1].matchAll(/\[(\d+)x(\d+)\]/g)]
  .reduce((s, m) => s + Number(m[1]) * Number(m[2]), 0)

let failed = 0
let passed = 0
function ok (name, detail) {
  passed++
  console.log(`ok   ${name}: ${detail}`)
}
function fail (name, detail) {
  failed++
  console.log(`FAIL ${name}: ${detail}`)
}
class CheckError extends Error {}
function check (cond, msg) {
  if (!cond) throw new CheckError(msg)
}

const overall = setTimeout(() => {
  console.log(`FAIL deadline: the client did not finish within ${timeoutMs} ms`)
  process.exit(1)
}, timeoutMs)

// waitFor polls cond until it returns a truthy value or ms pass.
async function waitFor (what, ms, cond) {
  const end = Date.now() + ms
  for (;;) {
    const v = await cond()
    if (v) return v
    if (Date.now() > end) throw new CheckError(`timed out after ${ms} ms waiting for ${what}`)
    await new Promise(resolve => setTimeout(resolve, 50))
  }
}

// nodeStatus reads a node's /status (node A's unless id names node B).
async function nodeStatus (id = bootId) {
  const url = statusURL[id.toString()]
  const res = await fetch(url, { signal: AbortSignal.timeout(2000) })
  check(res.ok, `GET ${url}: ${res.status}`)
  return res.json()
}

function hex (h) {
  return Uint8Array.from(Buffer.from(h.replace(/\s+/g, ''), 'hex'))
}
// same compares bytes; a string is read as hex.
function same (a, b) {
  const bytes = (x) => Buffer.from(typeof x === 'string' ? hex(x) : x)
  return bytes(a).equals(bytes(b))
}

// Section 1: uvarint, 7 bits a byte, least significant group first.
function uvarint (n) {
  const out = []
  while (n >= 0x80) {
    out.push((n & 0x7f) | 0x80)
    n = Math.floor(n / 128)
  }
  out.push(n)
  return Uint8Array.from(out)
}

// Section 5: a frame is uvarint(length) followed by the body.
function frame (body) {
  const prefix = uvarint(body.length)
  const out = new Uint8Array(prefix.length + body.length)
  out.set(prefix)
  out.set(body, prefix.length)
  return out
}

// readFrame reads one frame, checking the length against cap before
// reading the body (section 5). It returns null on end-of-stream before the
// first byte.
async function readFrame (bytes, cap, signal) {
  let len = 0
  let mul = 1
  for (let i = 0; ; i++) {
    check(i < 10, 'length prefix longer than 10 bytes')
    let b
    try {
      b = await bytes.read({ bytes: 1, signal })
    } catch (err) {
      if (i === 0 && err.name === 'UnexpectedEOFError') return null
      throw err
    }
    const v = b.get(0)
    len += (v & 0x7f) * mul
    mul *= 128
    if ((v & 0x80) === 0) break
  }
  check(len <= cap, `frame length ${len} above the cap ${cap}`)
  if (len === 0) return new Uint8Array(0)
  return (await bytes.read({ bytes: len, signal })).subarray()
}

// Section 6.2: step request, 18 bytes, big-endian.
function stepRequest (kind, step, estimate) {
  const b = new Uint8Array(18)
  const dv = new DataView(b.buffer)
  dv.setUint8(0, 1)
  dv.setUint8(1, kind)
  dv.setBigInt64(2, BigInt(step))
  dv.setFloat64(10, estimate)
  return b
}

// Section 6.3: step reply, 26 bytes, big-endian.
function parseStepReply (body) {
  check(body.length === 26, `step reply body is ${body.length} bytes, want 26`)
  const dv = new DataView(body.buffer, body.byteOffset, body.byteLength)
  const r = {
    version: dv.getUint8(0),
    flags: dv.getUint8(1),
    step: dv.getBigInt64(2),
    estimate: dv.getFloat64(10),
    interval: dv.getFloat64(18)
  }
  check(r.version === 1, `step reply version ${r.version}, want 1`)
  check((r.flags & 0xfe) === 0, `step reply flags 0x${r.flags.toString(16)} set bits 1-7`)
  check(r.step >= 0n, `step reply step ${r.step} < 0`)
  check(Number.isFinite(r.estimate) && r.estimate >= 0, `step reply estimate ${r.estimate}`)
  check(Number.isFinite(r.interval) && r.interval >= 0, `step reply interval ${r.interval}`)
  return r
}

// Section 6.2, as the answerer: validate a request pspnode sends us.
function parseStepRequest (body) {
  check(body.length === 18, `step request body is ${body.length} bytes, want 18`)
  const dv = new DataView(body.buffer, body.byteOffset, body.byteLength)
  const r = { version: dv.getUint8(0), kind: dv.getUint8(1), step: dv.getBigInt64(2), estimate: dv.getFloat64(10) }
  check(r.version === 1, `step request version ${r.version}`)
  check(r.kind === 1 || r.kind === 2, `step request kind ${r.kind}`)
  check(r.step >= 0n, `step request step ${r.step}`)
  check(Number.isFinite(r.estimate) && r.estimate >= 0, `step request estimate ${r.estimate}`)
  return r
}

// Section 6.12: the fields of step protocol 1.1.0 that follow the 1.0.0
// body: tag u8, length u8, value; tags increasing, each once; unknown tags
// skipped. fields is a list of [tag, bytes].
function stepFields (fields) {
  const parts = []
  for (const [tag, v] of fields) parts.push(Uint8Array.of(tag, v.length), v)
  return Buffer.concat(parts)
}
function genesisField (hexString) { return [1, hex(hexString)] }
function modelField (id, n) {
  const v = new Uint8Array(8)
  const dv = new DataView(v.buffer)
  dv.setUint32(0, id)
  dv.setUint32(4, n)
  return [2, v]
}
function parseStepFields (b) {
  const out = { genesis: null, model: null, notices: null, unknown: 0 }
  let last = -1
  let i = 0
  while (i < b.length) {
    check(i + 2 <= b.length, 'field cut short')
    const tag = b[i]
    const len = b[i + 1]
    check(i + 2 + len <= b.length, `field ${tag} of ${len} bytes cut short`)
    check(tag > last, `field ${tag} after field ${last}`)
    last = tag
    const v = b.subarray(i + 2, i + 2 + len)
    if (tag === 1) {
      check(len === 16, `genesis field of ${len} bytes`)
      check(v.some(x => x !== 0), 'zero genesis field')
      out.genesis = Buffer.from(v).toString('hex')
    } else if (tag === 2) {
      check(len === 8, `model field of ${len} bytes`)
      const dv = new DataView(v.buffer, v.byteOffset, v.byteLength)
      out.model = { id: dv.getUint32(0), n: dv.getUint32(4) }
    } else if (tag === 3) {
      check(len === 4, `notices field of ${len} bytes`)
      out.notices = new DataView(v.buffer, v.byteOffset, v.byteLength).getUint32(0)
    } else {
      out.unknown++
    }
    i += 2 + len
  }
  return out
}
function stepRequest11 (kind, step, estimate, fields) {
  return Buffer.concat([stepRequest(kind, step, estimate), stepFields(fields)])
}
function parseStepReply11 (body) {
  check(body.length >= 26, `step reply body is ${body.length} bytes, want at least 26`)
  return { ...parseStepReply(body.subarray(0, 26)), ...parseStepFields(body.subarray(26)) }
}

// Section 7.2: model request, 9 bytes: version 2, first block, count.
function modelRequest (first, count) {
  const b = new Uint8Array(9)
  const dv = new DataView(b.buffer)
  dv.setUint8(0, 2)
  dv.setUint32(1, first)
  dv.setUint32(5, count)
  return b
}

// Section 7.3: the model reply's head, 21 bytes, big-endian.
const BLOCK = 262144
function parseModelHead (body, wantId = modelId, wantN = nParams) {
  check(body.length === 21, `model reply head of ${body.length} bytes, want 21`)
  const dv = new DataView(body.buffer, body.byteOffset, body.byteLength)
  const version = dv.getUint8(0)
  const step = dv.getBigInt64(1)
  const id = dv.getUint32(9)
  const n = dv.getUint32(13)
  const block = dv.getUint32(17)
  check(version === 2, `model reply version ${version}`)
  check(step >= 0n, `model reply step ${step}`)
  check(id === wantId, `model id 0x${id.toString(16)}, want 0x${wantId.toString(16)}`)
  check(n === wantN, `model n ${n}, want ${wantN}`)
  check(block === BLOCK, `blocks of ${block} values, want ${BLOCK}`)
  return { step, id, n }
}

// Section 7.3: one block of a model reply: index and count (big-endian),
// then count float32 values, little-endian.
function parseModelBlock (bytes8, values, wantBlock, wantCount) {
  const dv = new DataView(bytes8.buffer, bytes8.byteOffset, bytes8.byteLength)
  check(dv.getUint32(0) === wantBlock && dv.getUint32(4) === wantCount,
    `block ${dv.getUint32(0)} of ${dv.getUint32(4)} values, want block ${wantBlock} of ${wantCount}`)
  const vv = new DataView(values.buffer, values.byteOffset, values.byteLength)
  const out = []
  for (let i = 0; i < wantCount; i++) {
    const v = vv.getFloat32(4 * i, true)
    check(Number.isFinite(v), `parameter ${i} is ${v}`)
    out.push(v)
  }
  return out
}

// Section 10.3: decode and validate a GossipSub update (little-endian):
// the checks of section 10.5 that do not depend on the receiver's step.
// sender is the binary peer ID the message was signed by.
function parseUpdate (data, sender, wantId = modelId, wantN = nParams) {
  check(data.length >= 3, `update of ${data.length} bytes`)
  const dv = new DataView(data.buffer, data.byteOffset, data.byteLength)
  const version = dv.getUint8(0)
  const enc = dv.getUint8(1)
  const L = dv.getUint8(2)
  check(version === 1, `update version ${version}`)
  check(enc >= 1 && enc <= 4, `update encoding ${enc}`)
  check(L >= 1 && L <= 128 && data.length >= 19 + L, `update sender length ${L} in ${data.length} bytes`)
  check(Buffer.from(data.subarray(3, 3 + L)).equals(Buffer.from(sender)),
    'update sender field differs from the signed from')
  const step = dv.getBigInt64(3 + L, true)
  const id = dv.getUint32(11 + L, true)
  const N = dv.getUint32(15 + L, true)
  check(step >= 0n, `update step ${step} < 0`)
  check(id === wantId, `update model id 0x${id.toString(16)}, want 0x${wantId.toString(16)}`)
  check(N === wantN, `update N ${N}, want ${wantN}`)
  const width = enc === 1 || enc === 3 ? 4 : 2
  let off = 19 + L
  let indices = null
  if (enc >= 3) {
    check(data.length >= off + 9, 'sparse header cut short')
    const K = dv.getUint32(off, true)
    const coding = dv.getUint8(off + 4)
    const B = dv.getUint32(off + 5, true)
    check(K <= N, `sparse K ${K} > N ${N}`)
    check(data.length === off + 9 + B + width * K,
      `update is ${data.length} bytes, want ${off + 9 + B + width * K}`)
    const block = data.subarray(off + 9, off + 9 + B)
    indices = []
    if (coding === 0) { // gaps: K uvarints, each index − previous − 1
      let pos = 0
      let prev = -1
      while (pos < block.length) {
        let v = 0
        let mul = 1
        for (;;) {
          check(pos < block.length, 'gap uvarint cut short')
          const byte = block[pos++]
          v += (byte & 0x7f) * mul
          mul *= 128
          if ((byte & 0x80) === 0) break
        }
        prev = prev + 1 + v
        check(prev < N, `index ${prev} ≥ N`)
        indices.push(prev)
      }
    } else {
      check(coding === 1, `index coding ${coding}`)
      check(B === Math.ceil(N / 8), `bitmap of ${B} bytes, want ${Math.ceil(N / 8)}`)
      for (let i = 0; i < 8 * B; i++) {
        if (block[i >> 3] & (1 << (i & 7))) {
          check(i < N, `bitmap padding bit ${i} set`)
          indices.push(i)
        }
      }
    }
    check(indices.length === K, `index block holds ${indices.length} indices, want K = ${K}`)
    off += 9 + B
  } else {
    check(data.length === off + width * N, `update is ${data.length} bytes, want ${off + width * N}`)
  }
  const count = indices == null ? N : indices.length
  const values = []
  for (let i = 0; i < count; i++) {
    values.push(width === 4 ? dv.getFloat32(off + 4 * i, true) : f16(dv.getUint16(off + 2 * i, true)))
  }
  for (const v of values) {
    check(Number.isFinite(v), `update value ${v} not finite`)
    check(Math.abs(v) <= 1e4, `update value ${v} above 1e4`)
  }
  return { enc, step, N, indices, values }
}

// Section 10.3: a dense32 update (little-endian), as the client publishes.
function encodeDense32 (sender, step, id, values) {
  const L = sender.length
  const b = new Uint8Array(19 + L + 4 * values.length)
  const dv = new DataView(b.buffer)
  dv.setUint8(0, 1)
  dv.setUint8(1, 1)
  dv.setUint8(2, L)
  b.set(sender, 3)
  dv.setBigInt64(3 + L, BigInt(step), true)
  dv.setUint32(11 + L, id, true)
  dv.setUint32(15 + L, values.length, true)
  values.forEach((v, i) => dv.setFloat32(19 + L + 4 * i, v, true))
  return b
}

// Section 10.2: the message ID is the origin's binary peer ID (the signed
// from) followed by the 8-byte big-endian seqno. js-libp2p-gossipsub's
// default under StrictSign (msgIdFnStrictSign) puts the protobuf public key
// where the peer ID belongs, so the client sets the ID function itself.
function msgIdFromSeqno (msg) {
  check(msg.type === 'signed', `unsigned message (type ${msg.type}) under StrictSign`)
  const from = msg.from.toMultihash().bytes
  const id = new Uint8Array(from.length + 8)
  id.set(from)
  new DataView(id.buffer).setBigUint64(from.length, msg.sequenceNumber)
  return id
}

function f16 (h) {
  const s = h & 0x8000 ? -1 : 1
  const e = (h >> 10) & 0x1f
  const m = h & 0x3ff
  if (e === 0) return s * m * 2 ** -24
  if (e === 31) return m ? NaN : s * Infinity
  return s * (1 + m / 1024) * 2 ** (e - 15)
}

// Section 6.1, as answerer: pspnode may sample this client at its barrier
// once the client's query made it a member. The client does not train, so
// it answers with the leaving flag (section 14: the way to stay out of
// barriers), after checking the request against section 6.2.
const served = { queries: 0, bad: [] }
async function serveStep ({ stream }) {
  const bytes = byteStream(stream)
  const signal = AbortSignal.timeout(2000)
  try {
    const body = await readFrame(bytes, 64, signal)
    if (body == null) return
    const q = parseStepRequest(body)
    served.queries++
    if (q.kind === 1) {
      const reply = new Uint8Array(26)
      reply[0] = 1
      reply[1] = 0x01 // leaving
      await bytes.write(frame(reply), { signal })
    }
    await stream.close({ signal })
  } catch (err) {
    if (err instanceof CheckError) served.bad.push(err.message)
    stream.abort(err)
  }
}

const node = await createLibp2p({
  addresses: { listen: ['/ip4/127.0.0.1/tcp/0'] },
  transports: [tcp()],
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  services: {
    identify: identify(),
    ping: ping(),
    // Client mode: the client asks and does not serve. No self-query or
    // automatic lookups: the only lookup is the one check 2 makes, so what
    // it finds comes from that lookup.
    dht: kadDHT({
      protocol: proto.kad,
      clientMode: true,
      peerInfoMapper: passthroughMapper,
      allowQueryWithZeroPeers: true,
      initialQuerySelfInterval: 3600_000,
      querySelfInterval: 3600_000
    }),
    // asyncValidation with no verdict ever reported: the client sees every
    // message but relays none. js-libp2p-gossipsub forwards a message to
    // every mesh peer but the one it came from, the message's author
    // included; go-libp2p-pubsub counts a peer that sends a node its own
    // message as an invalid delivery (RejectSelfOrigin), and a few of those
    // beside the invalid update below pushed the client under the nodes'
    // graylist threshold. The client is a client, not a relay.
    pubsub: gossipsub({ globalSignaturePolicy: 'StrictSign', allowPublishToZeroTopicPeers: true, msgIdFn: msgIdFromSeqno, asyncValidation: true })
  }
})
await node.handle(proto.step, serveStep)

// Gossip: subscribe first, so that updates are collected while the other
// checks run.
const updates = { valid: 0, maxStep: new Map(), encodings: new Set(), bad: [] }
node.services.pubsub.addEventListener('message', (evt) => {
  const msg = evt.detail
  if (msg.topic !== topic) return
  try {
    check(msg.type === 'signed', `unsigned message (type ${msg.type}) under StrictSign`)
    const u = parseUpdate(msg.data, msg.from.toMultihash().bytes)
    check(u.step >= 1n, `update step ${u.step}: a node's first update carries step 1`)
    updates.valid++
    updates.encodings.add(u.enc)
    const from = msg.from.toString()
    if (!(updates.maxStep.get(from) >= u.step)) updates.maxStep.set(from, u.step)
  } catch (err) {
    updates.bad.push(err.message)
  }
})
node.services.pubsub.subscribe(topic)
let heartbeats = 0
node.services.pubsub.addEventListener('gossipsub:heartbeat', () => { heartbeats++ })

const t0 = Date.now()
async function run (name, fn) {
  try {
    ok(name, await fn())
  } catch (err) {
    fail(name, err instanceof CheckError ? err.message : (err.stack ?? String(err)))
  }
  console.log(`     (${Date.now() - t0} ms)`)
}

// The worked examples of sections 6.5, 6.12, 7.4, 7.5 and 10.6 (8.6's are in
// the pool check), through the same encoders and decoders as the checks
// against the live nodes below: if an example disagrees with this client,
// either the example or the client is wrong, and the live checks say which.
await run('examples', async () => {
  const unframe = (f) => {
    check(f[0] < 0x80 && f[0] === f.length - 1, `frame prefix ${f[0]} for ${f.length} bytes`)
    return f.subarray(1)
  }
  check(same(frame(stepRequest(1, 42, 199.5)), hex('120101000000000000002a4068f00000000000')), '6.5 query')
  check(same(frame(stepRequest(2, 42, 0)), hex('120102000000000000002a0000000000000000')), '6.5 leave notice')
  let r = parseStepReply(unframe(hex('1a0100000000000000002840690000000000003ff4000000000000')))
  check(r.flags === 0 && r.step === 40n && r.estimate === 200 && r.interval === 1.25, '6.5 reply')
  r = parseStepReply(unframe(hex('1a0101000000000000002900000000000000000000000000000000')))
  check(r.flags === 1 && r.step === 41n && r.estimate === 0 && r.interval === 0, '6.5 leaving reply')
  // 6.12: the same with the genesis and model fields.
  const gen = '1816687ec05700000102030405060708'
  const linreg20 = modelField(0x1f8601fc, 21)
  check(same(frame(stepRequest11(1, 42, 199.5, [genesisField(gen), linreg20])),
    hex('2e0101000000000000002a4068f0000000000001101816687ec0570000010203040506070802081f8601fc00000015')), '6.12 query')
  r = parseStepReply11(unframe(hex('360100000000000000002840690000000000003ff400000000000001101816687ec0570000010203040506070802081f8601fc00000015')))
  check(r.step === 40n && r.interval === 1.25 && r.genesis === gen && r.model.id === 0x1f8601fc && r.model.n === 21, '6.12 reply')
  r = parseStepReply11(unframe(hex('2c0100000000000000002840690000000000003ff400000000000001101816687ec05700000102030405060708')))
  check(r.genesis === gen && r.model === null, '6.12 reply without a model')
  r = parseStepReply11(unframe(hex('24010000000000000000280000000000000000000000000000000002080000000000000000')))
  check(r.step === 40n && r.genesis === null && r.model.id === 0 && r.model.n === 0, '6.12 reply of a node without a model')
  r = parseStepReply11(unframe(hex('1a0100000000000000002840690000000000003ff4000000000000')))
  check(r.genesis === null && r.model === null, '6.12 reply without fields')
  const q = stepRequest11(1, 42, 199.5, [genesisField(gen), linreg20, [9, hex('aabbcc')]])
  const qf = parseStepFields(q.subarray(18))
  check(qf.genesis === gen && qf.model.n === 21 && qf.unknown === 1 &&
    Buffer.from(q.subarray(q.length - 15)).toString('hex') === '02081f8601fc000000150903aabbcc', '6.12 unknown field')
  check(same(frame(modelRequest(0, 1)), hex('09020000000000000001')), '7.4 request frame')
  const linreg2 = modelIdOf('linreg|w[1x2] b[1x1]')
  check(linreg2 === 0x44734f20, `7.5 model id 0x${linreg2.toString(16)}`)
  const reply = hex('1502000000000000000c44734f200000000300040000' + '0000000000000003' + '0000003f000020c00000803f')
  const mh = parseModelHead(unframe(reply.subarray(0, 22)), linreg2, 3)
  const mv = parseModelBlock(reply.subarray(22, 30), reply.subarray(30), 0, 3)
  check(mh.step === 12n && mv.join() === '0.5,-2.5,1', '7.4 model reply')
  const sender = hex('002408011220 03a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8')
  check(same(peerIdFromString('12D3KooWA4Xop1JaT3MHxwYMkCepYsv4iPVopMXwCz5iHYdBfeSB').toMultihash().bytes, sender),
    '10.6 sender peer ID')
  const head = '01012600240801122003a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8'
  const examples = [
    ['dense32', head + '0700000000000000204f7344030000000000003f000020c00000803f', linreg2, 3, null, '0.5,-2.5,1', 69],
    ['dense16', head.replace(/^0101/, '0102') + '0700000000000000204f734403000000003800c1003c', linreg2, 3, null, '0.5,-2.5,1', 63],
    ['topk32', head.replace(/^0101/, '0103') + '0700000000000000efbeadde100000000200000000020000000905000040c000000040',
      0xdeadbeef, 16, '9,15', '-3,2', 76],
    ['topk16', head.replace(/^0101/, '0104') + '0700000000000000efbeadde100000000400000001020000000486003a00c2662e0040',
      0xdeadbeef, 16, '2,9,10,15', '0.75,-3,0.0999755859375,2', 76]
  ]
  for (const [name, h, id, n, idx, vals, size] of examples) {
    const data = hex(h)
    check(data.length === size, `10.6 ${name}: ${data.length} bytes, the text says ${size}`)
    const u = parseUpdate(data, sender, id, n)
    check(u.step === 7n && String(u.indices ?? null) === String(idx) && u.values.join() === vals,
      `10.6 ${name}: step ${u.step}, indices ${u.indices}, values ${u.values}`)
  }
  check(same(encodeDense32(sender, 7, linreg2, [0.5, -2.5, 1]), hex(examples[0][1])), '10.6 dense32 encoding')
  const signed = { type: 'signed', from: peerIdFromString('12D3KooWA4Xop1JaT3MHxwYMkCepYsv4iPVopMXwCz5iHYdBfeSB'), sequenceNumber: 0x0102030405060708n }
  check(same(msgIdFromSeqno(signed), Buffer.concat([sender, hex('0102030405060708')])), '10.2 message ID')
  return 'the worked examples of 6.5, 6.12, 7.4, 7.5 and 10.6 decode as the text says'
})

await run('connect', async () => {
  await node.dial(bootAddr, { signal: AbortSignal.timeout(10000) })
  return `dialled ${bootAddr}`
})

// Check 1 (section 4): identify lists the job's protocols.
await run('identify', async () => {
  const peer = await waitFor('identify of the bootstrap node', 10000, async () => {
    try {
      const p = await node.peerStore.get(bootId)
      return p.protocols.includes(proto.kad) ? p : null
    } catch {
      return null
    }
  })
  // Section 4 lists the protocols observed for a node with a model; every
  // one of them must be there (others may be added).
  const listed = ['/floodsub/1.0.0', '/ipfs/id/1.0.0', '/ipfs/id/push/1.0.0', '/ipfs/ping/1.0.0',
    '/libp2p/circuit/relay/0.2.0/stop', '/meshsub/1.0.0', '/meshsub/1.1.0', '/meshsub/1.2.0',
    '/meshsub/1.3.0', `/psp/${job}/exchange/2.0.0`, ...Object.values(proto)]
  for (const p of listed) {
    check(peer.protocols.includes(p), `identify lacks ${p}: ${peer.protocols.join(' ')}`)
  }
  const agent = new TextDecoder().decode(peer.metadata.get('AgentVersion'))
  const pv = new TextDecoder().decode(peer.metadata.get('ProtocolVersion'))
  check(agent.startsWith('pspnode/'), `agent version ${agent}`)
  check(pv === 'psp/1', `protocol version ${pv}`)
  return `${agent}, ${pv}, ${peer.protocols.join(' ')}`
})

// Check 2 (section 9): a FIND_NODE lookup through the bootstrap node finds
// node B, whose peer ID the client knows but whose address it does not.
await run('kad', async () => {
  const dht = node.services.dht
  await waitFor('the bootstrap node in the DHT routing table', 10000, () => dht.routingTable.size > 0)
  const known = await node.peerStore.get(targetId).then(p => p.addresses.length, () => 0)
  check(known === 0 && node.getConnections(targetId).length === 0,
    'node B was known before the lookup')
  let listed = null
  let found = null
  for await (const ev of dht.findPeer(targetId, { useCache: false, signal: AbortSignal.timeout(10000) })) {
    if (ev.name === 'PEER_RESPONSE' && ev.messageName === 'FIND_NODE' && ev.from.equals(bootId)) {
      listed = ev.closer.find(p => p.id.equals(targetId)) ?? listed
    }
    if (ev.name === 'FINAL_PEER' && ev.peer.id.equals(targetId)) {
      found = ev.peer
      break
    }
  }
  check(listed != null, 'the bootstrap node\'s FIND_NODE reply did not list node B')
  check(found != null, 'findPeer did not find node B')
  const want = targetAddr.decapsulateCode(421).toString() // without /p2p/<id>
  const addrs = found.multiaddrs.map(a => a.toString())
  check(addrs.includes(want), `node B's addresses ${addrs.join(' ')} lack ${want}`)
  await node.dial(targetId, { signal: AbortSignal.timeout(10000) })
  return `FIND_NODE via ${bootId} returned ${targetId} at ${addrs.join(' ')}`
})

// Check 4 (sections 5, 6.2, 6.3, 6.7): two step queries on one stream.
await run('step', async () => {
  const before = await nodeStatus()
  const signal = AbortSignal.timeout(5000)
  const stream = await node.dialProtocol(bootId, proto.step, { signal })
  const bytes = byteStream(stream)
  const replies = []
  for (let i = 0; i < 2; i++) {
    await bytes.write(frame(stepRequest(1, 0, 0)), { signal })
    const body = await readFrame(bytes, 64, signal)
    check(body != null, 'end of stream before the reply')
    replies.push(parseStepReply(body))
  }
  await bytes.unwrap().close({ signal })
  const after = await nodeStatus()
  const [r1, r2] = replies
  check(r1.flags === 0 && r2.flags === 0, 'the node replied with the leaving flag')
  // Estimate: nodes, itself included, or 0 for none; a two-node job is
  // far below 64.
  for (const r of replies) {
    check(r.estimate === 0 || (r.estimate >= 1 && r.estimate <= 64), `estimate ${r.estimate} for a two-node job`)
  }
  // Interval: the same mean step time, in seconds, that /status reports as
  // step_interval_s, read just before and after; it moves with every step
  // (a stall of a loaded machine can lift it several times over for a few
  // steps), so allow a factor of 10.
  const lo = Math.min(before.step_interval_s, after.step_interval_s) / 10
  const hi = Math.max(before.step_interval_s, after.step_interval_s) * 10
  check(r2.interval === 0 || (lo <= r2.interval && r2.interval <= hi),
    `interval ${r2.interval} s, /status says ${before.step_interval_s} then ${after.step_interval_s}`)
  check(BigInt(before.step) <= r1.step && r1.step <= r2.step && r2.step <= BigInt(after.step),
    `steps out of order: /status ${before.step}, replies ${r1.step} and ${r2.step}, /status ${after.step}`)
  return `replies step ${r1.step}, ${r2.step} (status ${before.step}..${after.step}), ` +
    `estimate ${r2.estimate}, interval ${r2.interval.toFixed(4)} s`
})

// Check 4b (sections 6.11, 6.12): the same on step protocol 1.1.0, with
// this client's model field and a field of a tag no version defines, which
// the nodes must skip, sent in the first query on the stream and not in the
// second. Both nodes say the job's model and one genesis, the one their
// /status shows (node B took it from node A when it joined, or, if both
// made one at once, converged on the older), in their first reply; a later
// reply without fields says the same.
await run('step11', async () => {
  const lineages = []
  for (const id of [bootId, targetId]) {
    const signal = AbortSignal.timeout(5000)
    const stream = await node.dialProtocol(id, proto.step11, { signal })
    const bytes = byteStream(stream)
    const replies = []
    let heard = { genesis: null, model: null, notices: null }
    for (let i = 0; i < 2; i++) {
      const fields = i === 0 ? [modelField(modelId, nParams), [200, hex('00ff')]] : []
      await bytes.write(frame(stepRequest11(1, 0, 0, fields)), { signal })
      const body = await readFrame(bytes, 255, signal)
      check(body != null, 'end of stream before the reply')
      const r = parseStepReply11(body)
      if (r.genesis == null && r.model == null && r.notices == null) {
        check(i > 0, `node ${id} sent no fields in its first reply on the stream`)
        Object.assign(r, heard) // "as before on this stream"
      } else {
        heard = { genesis: r.genesis, model: r.model, notices: r.notices }
      }
      replies.push(r)
    }
    await bytes.unwrap().close({ signal })
    for (const r of replies) {
      check(r.flags === 0, `node ${id} replied with the leaving flag`)
      check(r.model != null && r.model.id === modelId && r.model.n === nParams,
        `node ${id} says model ${JSON.stringify(r.model)}, want id 0x${modelId.toString(16)} with ${nParams} parameters`)
      check(r.genesis != null, `node ${id} says no genesis`)
      // The nodes run pSSP(2, 4): they send progress notices, with the
      // staleness bound 4 (6.6, 6.12).
      check(r.notices === 4, `node ${id} says notices ${r.notices}, want the staleness bound 4 of pssp:2:4`)
      check(r.unknown === 0, `node ${id} sent fields 6.12 does not define`)
    }
    check(replies[0].genesis === replies[1].genesis, `node ${id} changed its genesis between two replies`)
    lineages.push(replies[1].genesis)
  }
  await waitFor('both nodes on one lineage (/status lineage)', 10000, async () => {
    const [a, b] = [await nodeStatus(bootId), await nodeStatus(targetId)]
    return a.lineage && a.lineage === b.lineage
  })
  const st = await nodeStatus(bootId)
  check(lineages.includes(st.lineage), `the replies' geneses ${lineages.join(', ')} do not include /status's ${st.lineage}`)
  return `model id 0x${modelId.toString(16)} with ${nParams} parameters; genesis ${lineages.join(' and ')}; /status lineage ${st.lineage}`
})

// Section 7: fetch the model.
await run('model', async () => {
  const signal = AbortSignal.timeout(10000)
  const stream = await node.dialProtocol(bootId, proto.model, { signal })
  const bytes = byteStream(stream)
  const blocks = Math.ceil(nParams / BLOCK)
  await bytes.write(frame(modelRequest(0, blocks)), { signal })
  const body = await readFrame(bytes, 21, signal)
  check(body != null, 'end of stream before the reply')
  const m = parseModelHead(body)
  const params = []
  for (let b = 0; b < blocks; b++) {
    const count = Math.min(BLOCK, nParams - b * BLOCK)
    const head = (await bytes.read({ bytes: 8, signal })).subarray()
    const values = (await bytes.read({ bytes: 4 * count, signal })).subarray()
    params.push(...parseModelBlock(head, values, b, count))
  }
  await bytes.unwrap().close({ signal })
  const after = await nodeStatus()
  check(m.step <= BigInt(after.step), `model reply step ${m.step} above the node's step ${after.step}`)
  const norm = Math.hypot(...params)
  check(norm > 0, 'all parameters are zero: the node has not trained')
  const { id, n, step } = m
  return `model id 0x${id.toString(16)}, ${n} parameters at step ${step}, |θ| = ${norm.toFixed(4)}`
})

// Section 8: pool join, leave, and a stale join. The in-degree a join
// reply reports and /status's pool_in_degree must follow section 8.5.
function poolRequest (op, seq) {
  const b = new Uint8Array(10)
  const dv = new DataView(b.buffer)
  dv.setUint8(0, 1)
  dv.setUint8(1, op)
  dv.setBigUint64(2, BigInt(seq))
  return b
}

async function poolExchange (op, seq) {
  const signal = AbortSignal.timeout(3000)
  const stream = await node.dialProtocol(bootId, proto.pool, { signal })
  const bytes = byteStream(stream)
  await bytes.write(frame(poolRequest(op, seq)), { signal })
  await stream.closeWrite({ signal })
  if (op === 2) {
    await stream.close({ signal })
    return null
  }
  const body = await readFrame(bytes, 16, signal)
  check(body != null, 'end of stream before the pool reply')
  await stream.close({ signal })
  check(body.length === 6, `pool reply body is ${body.length} bytes, want 6`)
  const dv = new DataView(body.buffer, body.byteOffset, body.byteLength)
  check(dv.getUint8(0) === 1, `pool reply version ${dv.getUint8(0)}`)
  check(dv.getUint8(1) === 0, `pool reply flags ${dv.getUint8(1)}, the text says 0`)
  return dv.getUint32(2)
}

await run('pool', async () => {
  const refused = (await nodeStatus()).pool_requests_refused
  check(same(frame(poolRequest(1, 1)), '0a01010000000000000001'), '8.6 join frame')
  check(same(frame(poolRequest(2, 2)), '0a01020000000000000002'), '8.6 leave frame')
  const joined = await poolExchange(1, 1)
  check(joined >= 1, `in-degree ${joined} after the client's join`)
  await waitFor(`/status pool_in_degree ${joined}`, 3000, async () => (await nodeStatus()).pool_in_degree === joined)
  await poolExchange(2, 2)
  await waitFor(`/status pool_in_degree ${joined - 1} after the leave`, 3000,
    async () => (await nodeStatus()).pool_in_degree === joined - 1)
  const stale = await poolExchange(1, 1) // seq 1 ≤ 2: answered, not applied
  check(stale === joined - 1, `a stale join changed the in-degree: ${stale}, want ${joined - 1}`)
  const after = (await nodeStatus()).pool_requests_refused
  check(after === refused, `the node refused ${after - refused} of the client's pool requests`)
  return `join → in-degree ${joined}, leave → ${joined - 1}, stale join answered with ${stale}`
})

// Check 3 (section 10): updates from both nodes arrive and validate.
await run('gossip', async () => {
  const origins = [bootId, targetId]
  await waitFor('updates from both nodes', 15000, () =>
    updates.bad.length > 0 || (updates.valid >= 4 && origins.every(id => updates.maxStep.has(id.toString()))))
  check(updates.bad.length === 0, `invalid update: ${updates.bad[0]}`)
  // The step field is the sender's step (10.1): never above what its
  // /status reports afterwards. The highest step heard is taken first, and
  // /status read until it shows that step (the node counts a step before
  // it publishes its update, so at once): updates keep coming meanwhile,
  // and a step heard after the read would race the node's progress.
  const steps = []
  for (const id of origins) {
    const max = updates.maxStep.get(id.toString())
    let st
    await waitFor(`${id}'s /status step to reach ${max}, the step of an update it sent`, 5000, async () => {
      st = await nodeStatus(id)
      return max <= BigInt(st.step)
    })
    steps.push(`${max} ≤ ${st.step}`)
  }
  return `${updates.valid} valid updates from both nodes, encodings ${[...updates.encodings].join(',')}, ` +
    `latest steps ${steps.join(' and ')} (/status)`
})

// Sections 10.2 and 10.5: one invalid update (another model id: rejected,
// a penalty in the nodes' peer scores) must not make the nodes ignore the
// client's later updates. After it, the client publishes three valid
// updates, so large (1000 in every entry) that each node's norm bound
// refuses them once GossipSub has accepted them (10.5): they change no
// model. Then one update whose step is too far ahead, which the nodes
// ignore without a penalty (10.5, check 9): a reason no node's own
// updates produce, so its count says exactly that the client's updates
// still reach the nodes' validation.
async function metric (id, name) {
  const url = statusURL[id.toString()].replace(/\/status$/, '/metrics')
  const res = await fetch(url, { signal: AbortSignal.timeout(2000) })
  check(res.ok, `GET ${url}: ${res.status}`)
  const line = (await res.text()).split('\n').find(l => l.startsWith(name + ' '))
  return line == null ? 0 : Number(line.slice(name.length + 1))
}

await run('invalid', async () => {
  const origins = [bootId, targetId]
  const pubsub = node.services.pubsub
  const self = node.peerId.toMultihash().bytes
  await waitFor('both nodes among the topic\'s subscribers', 10000, () =>
    origins.every(id => pubsub.getSubscribers(topic).some(p => p.equals(id))))
  const publish = async (what, data) => {
    const { recipients } = await pubsub.publish(topic, data)
    check(origins.every(id => recipients.some(p => p.equals(id))),
      `the ${what} went to ${recipients.join(' ')}, not to both nodes`)
  }
  const ahead = 'psp_gossip_rejected_updates_total{reason="step_too_far_ahead"}'
  const before = await Promise.all(origins.map(async id => ({ ...(await nodeStatus(id)), ahead: await metric(id, ahead) })))
  const published = heartbeats
  await publish('invalid update', encodeDense32(self, 1, (modelId ^ 1) >>> 0, new Array(nParams).fill(0)))
  for (const [i, id] of origins.entries()) {
    await waitFor(`node ${id} to reject the invalid update`, 10000,
      async () => (await nodeStatus(id)).updates_rejected > before[i].updates_rejected)
  }
  // Wait until the invalid update has left the client's message cache (5
  // heartbeats): every IHAVE the client gossips for it has been sent and
  // answered by then. Under a message-ID function other than 10.2's, the
  // nodes do not recognise those IHAVEs, ask for the message again (IWANT),
  // and count every copy as one more invalid delivery: a few, and the
  // client is below their graylist threshold, its updates ignored.
  await waitFor('5 GossipSub heartbeats of the client', 15000, () => heartbeats >= published + 5)
  const valid = 3
  for (let i = 0; i < valid; i++) {
    await publish('valid update', encodeDense32(self, 2 + i, modelId, new Array(nParams).fill(1000)))
  }
  await publish('update from far ahead', encodeDense32(self, 2 ** 40, modelId, new Array(nParams).fill(0)))
  const counts = []
  for (const [i, id] of origins.entries()) {
    await waitFor(`node ${id} to take in the client's updates after the invalid one`, 10000, async () =>
      await metric(id, ahead) > before[i].ahead)
    const st = await nodeStatus(id)
    check(st.updates_norm_refused - before[i].updates_norm_refused >= valid,
      `node ${id} refused ${st.updates_norm_refused - before[i].updates_norm_refused} updates by their norm, want the client's ${valid} at least`)
    check(await metric(id, ahead) === before[i].ahead + 1, `node ${id} ignored more than the client's update from far ahead`)
    counts.push(st.updates_norm_refused - before[i].updates_norm_refused)
  }
  return 'each node rejected the invalid update, then took in the valid ones ' +
    `(refused by the norm bound: ${counts.join(' and ')}) and ignored the one from far ahead`
})

// pspnode's own step requests to this client, if any arrived, had to match
// section 6.2. This client serves only step protocol 1.0.0, as a peer that
// predates 1.1.0 does: pspnode must ask it in 1.0.0 (6.11).
await run('served', async () => {
  check(served.bad.length === 0, `malformed step request from pspnode: ${served.bad[0]}`)
  return `${served.queries} step requests from pspnode on 1.0.0 (this client serves no 1.1.0), all well-formed`
})

clearTimeout(overall)
await node.stop()
console.log(`     stopped (${Date.now() - t0} ms)`)
console.log(`interop: ${passed} checks ok, ${failed} failed`)
process.exit(failed === 0 ? 0 : 1)
