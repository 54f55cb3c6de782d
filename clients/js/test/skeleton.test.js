// The reference skeleton's storage port: what persist publishes, and how load answers for the worker.
// (The real worker and broker are in tests/integration/test_js_producer.py; here a plain HTTP server
// answers as the worker's /baseline documents, and a recording stand-in takes what would be sent.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { once } from 'node:events';
import { generateKeyPairSync } from 'node:crypto';
import { CHECKLIST, INSTRUCTION, TOOL, decided } from '../examples/bank-transfer.js';
import { BaselineUnavailable, DecisionSigner, EventPublisher, SkeletonStorage, chainProblems } from '../src/index.js';

const records = decided('u_sk', '2026-08-11T09:12:00.000Z');
const { privateKey } = generateKeyPairSync('ed25519');
const signer = DecisionSigner.fromPem(privateKey.export({ format: 'pem', type: 'pkcs8' }));

function recordingPublisher() {
  const sent = [];
  const kafka = {
    producer: () => ({
      connect: async () => {},
      disconnect: async () => {},
      send: async (batch) => {
        sent.push(JSON.parse(batch.messages[0].value));
        return [{ partition: 1, baseOffset: String(sent.length + 40) }];
      },
    }),
  };
  return { sent, publisher: new EventPublisher({ kafka, topic: 't' }) };
}

async function worker(answer) {
  const seen = [];
  const server = createServer((req, res) => {
    seen.push(req.url);
    const [status, body] = answer(req.url);
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(typeof body === 'string' ? body : JSON.stringify(body));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { seen, server, url: `http://127.0.0.1:${server.address().port}` };
}

function port(publisher, baselineUrl = 'http://127.0.0.1:9') {
  return new SkeletonStorage({ publisher, baselineUrl, userId: 'u_sk', tools: [TOOL], instruction: INSTRUCTION, signer });
}

test('persist publishes a decision as a run and the skeleton\'s executed record as its outcome', async () => {
  const { sent, publisher } = recordingPublisher();
  const storage = port(publisher);
  const call = storage.observe(async () => 'ok');
  await storage.persist('u_sk:bank.transfer', { ...records.execute, user_checklist: CHECKLIST });
  await call('bank.transfer', {});
  await storage.persist('u_sk:bank.transfer', { ...records.execute, execution_decision: 'executed', reason: 'done' });
  assert.equal(sent.length, 2);
  const [run, [outcome]] = sent;
  assert.equal(run.at(-1).decision, 'execute');
  assert.ok(run.find((e) => e.event_type === 'execution_approved').signature);
  assert.equal(outcome.event_type, 'executed');
  assert.deepEqual(chainProblems([...run, outcome]), []);
});

test('an executed record with no execute decision before it is refused', async () => {
  const { publisher } = recordingPublisher();
  await assert.rejects(port(publisher).persist('k', { ...records.execute, execution_decision: 'executed' }), /no execute decision/);
});

test('load passes its own last write, and answers the record, null, or BaselineUnavailable', async () => {
  const { publisher } = recordingPublisher();
  const answers = {
    '/baseline/u_sk%3Abank.transfer': [200, { status: 'ok', record: { execution_decision: 'executed', fields: [] } }],
    '/baseline/none': [200, { status: 'none', record: null }],
    '/baseline/busy': [503, { status: 'unavailable', reason: 'catching up' }],
    '/baseline/bad': [200, '{"status": "ok", "record": 3}'],
  };
  const w = await worker((url) => answers[url.split('?')[0]]);
  try {
    const storage = port(publisher, w.url);
    await storage.persist('u_sk:bank.transfer', records.ask);
    assert.deepEqual(await storage.load('u_sk:bank.transfer'), { execution_decision: 'executed', fields: [] });
    assert.match(w.seen[0], /min_offset=41&partition=1/);
    assert.equal(await storage.load('none'), null);
    await assert.rejects(storage.load('busy'), BaselineUnavailable);
    await assert.rejects(storage.load('bad'), BaselineUnavailable);
  } finally {
    w.server.close();
  }
  await assert.rejects(port(publisher, 'http://127.0.0.1:9').load('k'), BaselineUnavailable);
});
