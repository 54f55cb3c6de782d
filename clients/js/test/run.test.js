// Runs built from an agent's records: valid under the contract, chained, signed, closed as announced.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { CHECKLIST, INSTRUCTION, TEXT, TOOL, decided } from '../examples/bank-transfer.js';
import {
  DecisionSigner,
  RunShapeError,
  blockedGate,
  buildOutcome,
  buildRun,
  chainProblems,
  closedRecord,
  digestOf,
  eventProblems,
  verifyDecision,
} from '../src/index.js';

const at = '2026-08-11T09:12:00.000Z';
const records = decided('u_js', at);
const { privateKey } = generateKeyPairSync('ed25519');
const signer = DecisionSigner.fromPem(privateKey.export({ format: 'pem', type: 'pkcs8' }));
const common = { userId: 'u_js', agentId: 'agent-js', tool: TOOL, instruction: INSTRUCTION, evidence: records.evidence, userChecklist: CHECKLIST };
const runs = {
  ask_user: buildRun({ ...common, record: records.ask }),
  execute: buildRun({ ...common, record: records.execute, signer }),
  hold: buildRun({ ...common, record: records.hold, attempts: { tool_attempt: 2 } }),
};

for (const [decision, run] of Object.entries(runs)) {
  test(`a ${decision} run is valid under the contract, event by event`, () => {
    assert.deepEqual(run.events.flatMap((e) => eventProblems(e).map((p) => `${e.event_type} ${p}`)), []);
  });

  test(`a ${decision} run is one chain from run_started to a run_closed that counts it`, () => {
    assert.deepEqual(chainProblems(run.events), []);
    assert.equal(run.events[0].event_type, 'run_started');
    const closed = run.events.at(-1);
    assert.equal(closed.event_type, 'run_closed');
    assert.equal(closed.decision, decision);
    assert.equal(closed.event_count, run.events.length);
    assert.equal(closed.last_hash, run.events.at(-2).hash);
    assert.ok(run.events.every((e) => e.run_id === run.runId && e.action_key === 'u_js:bank.transfer'));
    assert.equal(new Set(run.events.map((e) => e.event_id)).size, run.events.length);
  });

  test(`a ${decision} run carries exactly one decision event`, () => {
    const decisionEvents = run.events.filter((e) => ['execution_approved', 'gate_blocked', 'run_deferred'].includes(e.event_type));
    assert.equal(decisionEvents.length, 1);
    const expected = decision === 'execute' ? 'execution_approved' : 'gate_blocked';
    assert.equal(decisionEvents[0].event_type, expected);
    if (expected === 'gate_blocked') assert.equal(decisionEvents[0].decision, decision);
  });
}

test('the run never writes the instruction text', () => {
  for (const run of Object.values(runs)) {
    const written = JSON.stringify(run.events);
    assert.ok(!written.includes(TEXT) && !written.includes('500,000 won'));
  }
});

test("the execute run's decision is signed over its own members", () => {
  const approved = runs.execute.events.find((e) => e.event_type === 'execution_approved');
  const decision = { ...approved, run_id: approved.run_id, action_key: approved.action_key };
  assert.ok(verifyDecision(decision, approved.signature, signer.publicKey));
  assert.equal(approved.arguments_digest, digestOf({ from_account: '1102534471', amount: 500000, to_account: '2200119' }));
  assert.equal(verifyDecision({ ...decision, arguments_digest: digestOf({}) }, approved.signature, signer.publicKey), false);
});

test('an unsigned execute run is written without a signature member', () => {
  const run = buildRun({ ...common, record: records.execute });
  const approved = run.events.find((e) => e.event_type === 'execution_approved');
  assert.ok(!('signature' in approved));
  assert.deepEqual(eventProblems(approved), []);
});

test("run_closed carries what no other event holds; fields_computed follows the record's fields", () => {
  assert.equal(runs.execute.events.at(-1).record.fields_computed, true);
  assert.equal(runs.hold.events.at(-1).record.fields_computed, false);
  assert.deepEqual(Object.keys(closedRecord(records.execute)).sort(), [
    'advisory_notes',
    'fields_computed',
    'reason',
    'schema_version',
    'timestamp',
    'unknown_count',
    'unverified_checklist_count',
  ]);
});

test('an outcome continues the closed run with the decision it acts on', () => {
  for (const [status, type] of [['executed', 'executed'], ['failed', 'execution_failed']]) {
    const [outcome] = buildOutcome(runs.execute, { status, result: 'ok', error: new Error('provider error') });
    assert.equal(outcome.event_type, type);
    assert.deepEqual(eventProblems(outcome), []);
    assert.deepEqual(chainProblems([...runs.execute.events, outcome]), []);
    assert.equal(outcome.decision_id, runs.execute.decision.decision_id);
    assert.equal(outcome.arguments_digest, runs.execute.decision.arguments_digest);
  }
});

test('only an execute run has an outcome, and only a known one', () => {
  assert.throws(() => buildOutcome(runs.ask_user, { status: 'executed' }), RunShapeError);
  assert.throws(() => buildOutcome(runs.execute, { status: 'maybe' }), RunShapeError);
});

test('a record without a decision of the contract is refused by name', () => {
  assert.throws(() => buildRun({ ...common, record: { ...records.ask, execution_decision: 'executed' } }), RunShapeError);
  assert.throws(() => buildRun({ ...common, record: null }), RunShapeError);
});

test('the blocking gate is read from the record as the SPEC names the gates', () => {
  const of = (gate, reason = '') => {
    const b = blockedGate({ gate, reason });
    return [b.gate_name, b.kind, b.gap_class];
  };
  assert.deepEqual(of({ kind: 'intent_undetermined' }), ['intent', 'intent_undetermined', 'instruction_gap']);
  assert.deepEqual(of({ kind: 'tool_undetermined_exhausted' }), ['tool', 'tool_undetermined_exhausted', 'action_definition_gap']);
  assert.deepEqual(of({ unknown_fields: [{ name: 'a', note: null }], unverified_checklist: [] }), ['value', 'value_gate', 'instruction_gap']);
  assert.deepEqual(of(null, 'preflight error: boom')[2], 'internal_error');
  assert.deepEqual(of(null, 'hold: checklist item without id at 0')[2], 'configuration_defect');
  const held = runs.hold.events.find((e) => e.event_type === 'gate_blocked');
  assert.deepEqual([held.gate_name, held.kind, held.gap_class], ['tool', 'tool_undetermined_exhausted', 'action_definition_gap']);
});
