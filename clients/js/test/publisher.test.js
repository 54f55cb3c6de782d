// Messages as they go on the wire, and what is refused before anything is sent.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CHECKLIST, INSTRUCTION, TOOL, decided } from '../examples/bank-transfer.js';
import {
  ContractViolation,
  EventPublisher,
  MessageShapeError,
  UNKEYED,
  buildRun,
  canonicalJson,
  encodeMessage,
  sealChain,
} from '../src/index.js';

const records = decided('u_js', '2026-08-11T09:12:00.000Z');
const run = buildRun({ userId: 'u_js', tool: TOOL, instruction: INSTRUCTION, evidence: records.evidence, userChecklist: CHECKLIST, record: records.ask });

/** A kafkajs stand-in that records what would be sent (the real broker is in the pytest integration test). */
function recordingKafka() {
  const sent = [];
  return {
    sent,
    producer: () => ({
      connect: async () => {},
      disconnect: async () => {},
      send: async (batch) => {
        sent.push(batch);
        return [{ partition: 0, baseOffset: String(sent.length - 1) }];
      },
    }),
  };
}

test('a message is keyed by its action_key, its value the events in canonical bytes, with the headers', () => {
  const message = encodeMessage(run.events);
  assert.equal(message.key, 'u_js:bank.transfer');
  assert.equal(message.value, `[${run.events.map((e) => canonicalJson(e)).join(',')}]`);
  assert.deepEqual(JSON.parse(message.value), run.events);
  assert.deepEqual(message.headers, {
    event_type: 'run_closed',
    schema_version: '3',
    event_count: String(run.events.length),
    run_id: run.runId,
  });
});

test('an unkeyed run goes under __preflight_unkeyed__; a message of two keys is refused', () => {
  const unkeyed = sealChain(run.events.map((e) => ({ ...e, action_key: null })));
  assert.equal(encodeMessage(unkeyed).key, UNKEYED);
  const mixed = sealChain(run.events.map((e, i) => ({ ...e, action_key: i ? 'b' : 'a' })));
  assert.throws(() => encodeMessage(mixed), MessageShapeError);
});

test('publish sends one message with acks from all replicas, and says where it landed', async () => {
  const kafka = recordingKafka();
  const publisher = new EventPublisher({ kafka, topic: 'preflight.events' });
  await publisher.connect();
  assert.deepEqual(await publisher.publish(run.events), { partition: 0, offset: 0 });
  assert.equal(kafka.sent.length, 1);
  assert.equal(kafka.sent[0].acks, -1);
  assert.equal(kafka.sent[0].messages.length, 1);
  await publisher.disconnect();
});

test('a broken chain, a partial run or an invalid event is refused before anything is sent', async () => {
  const kafka = recordingKafka();
  const publisher = new EventPublisher({ kafka, topic: 'preflight.events' });
  const altered = structuredClone(run.events);
  altered.find((e) => e.event_type === 'field_resolved').field.value = '9999999';
  await assert.rejects(publisher.publish(altered), MessageShapeError);
  await assert.rejects(publisher.publish(run.events.slice(0, -1)), MessageShapeError);
  const invalid = sealChain(run.events.map((e) => (e.event_type === 'run_started' ? { ...e, occurred_at: 'not a time' } : e)));
  await assert.rejects(publisher.publish(invalid), ContractViolation);
  await assert.rejects(publisher.publish([]), MessageShapeError);
  assert.equal(kafka.sent.length, 0);
});
