#!/usr/bin/env node
// The seed's bank transfer ("send 500,000 won to my landlord") as an agent in Node would publish it:
// an ask run (the recipient unknown), an execute run (the recipient answered; its decision signed) with
// its `executed` outcome, and a hold run (the tool refused twice). The agent decided each run itself; this
// script writes the records it decided and publishes them with the package.
//
//   node examples/bank-transfer.js --brokers HOST:PORT --topic TOPIC --user u_js --key decision.pem
//   node examples/bank-transfer.js ... --tampered     also one run whose value is changed after hashing
//   node examples/bank-transfer.js --dry-run --key decision.pem [--tampered]
//
// Prints one JSON line per message: {kind, run_id, action_key, partition, offset, decision_id?}; with
// --dry-run nothing is published and every event is printed instead, one JSON line each (the input of
// `preflight-audit contract check -`).
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { DecisionSigner, EventPublisher, buildOutcome, buildRun } from '../src/index.js';

export const TEXT = 'send 500,000 won to my landlord';
export const TOOL = {
  name: 'bank.transfer',
  description: 'Transfers are final. Confirm the recipient before calling.',
  inputSchema: {
    type: 'object',
    properties: { from_account: { type: 'string' }, amount: { type: 'integer' }, to_account: { type: 'string' } },
    required: ['from_account', 'amount', 'to_account'],
  },
};
export const INSTRUCTION = [
  { text: TEXT, trust: 'user' },
  { text: '', trust: 'untrusted', origin: 'gmail:msg_881' },
];
export const CHECKLIST = [{ id: 'chk_limit', description: 'within daily transfer limit' }];
const AMOUNT_SPAN = [TEXT.indexOf('500,000'), TEXT.indexOf('500,000') + '500,000'.length];

function fixed(approved) {
  return {
    c1_when_case: 'immediate',
    c2_user_action_name: 'send money to my landlord',
    c3_provider_action_name: TOOL.name,
    c2_source: 'instruction',
    c3_match: approved
      ? { approved: true, reason: 'transfer is what the user asked for' }
      : { approved: false, reason: 'the tool does not match' },
  };
}

function known(name, value, source, at) {
  return { name, value, status: 'known', source, origin_source: source, resolved_at: at };
}

/** The records this agent decided for `user`, and each field's evidence. */
export function decided(user, at) {
  const actionKey = `${user}:${TOOL.name}`;
  const verified = CHECKLIST.map((item) => ({ ...item, status: 'verified', source: 'measured_data' }));
  const base = { schema_version: '1.8', action_key: actionKey, phase: 'at_trigger', advisory_notes: TOOL.description, timestamp: at };
  const fromAccount = known('from_account', '1102534471', 'pre_set_data', at);
  const amount = known('amount', 500000, 'instruction', at);
  const ask = {
    ...base,
    fixed: fixed(true),
    fields: [fromAccount, amount, { name: 'to_account', status: 'unknown', source: null, origin_source: null, resolved_at: at }],
    user_checklist: verified,
    unknown_count: 1,
    unverified_checklist_count: 0,
    gate: {
      unknown_fields: [{ name: 'to_account', note: 'not found in any source' }],
      unverified_checklist: [],
      // The agent's diagnostics: a float and a key outside the Basic Multilingual Plane, whose canonical
      // form (ECMAScript number form; keys by UTF-16 code units) the consumers must hash alike.
      _diag: { extractor_confidence: 0.875, scale: 1e21, '\u{1F4B8}': 'transfer', '\uFFFD': 'after it' },
    },
    execution_decision: 'ask_user',
    reason: 'ask_user: unknown_fields=1, unverified_checklist=0',
  };
  const execute = {
    ...base,
    fixed: fixed(true),
    fields: [fromAccount, amount, known('to_account', '2200119', 'user_answer', at)],
    user_checklist: verified,
    unknown_count: 0,
    unverified_checklist_count: 0,
    gate: { unknown_fields: [], unverified_checklist: [] },
    execution_decision: 'execute',
    reason: 'execute: unknown_fields=0, unverified_checklist=0',
  };
  const hold = {
    ...base,
    fixed: fixed(false),
    fields: null,
    advisory_notes: '',
    user_checklist: CHECKLIST,
    unknown_count: null,
    unverified_checklist_count: null,
    gate: { kind: 'tool_undetermined_exhausted', user_message: 'The selected tool could not be confirmed.', next_tool_attempt: null },
    execution_decision: 'hold',
    reason: 'hold: the tool could not be confirmed after 2 attempts',
  };
  const evidence = {
    from_account: { pre_set_origin: null },
    amount: { segment_index: 0, span: AMOUNT_SPAN, segment_origin: null },
    to_account: {},
  };
  return { ask, execute, hold, evidence };
}

/** A stand-in for kafkajs that prints each message's events, one JSON line each, instead of sending. */
function printingKafka() {
  let offset = 0;
  return {
    producer: () => ({
      connect: async () => {},
      disconnect: async () => {},
      send: async ({ messages }) => {
        for (const event of JSON.parse(messages[0].value)) process.stdout.write(`${JSON.stringify(event)}\n`);
        return [{ partition: 0, baseOffset: String(offset++) }];
      },
    }),
  };
}

async function main() {
  const { values } = parseArgs({
    options: {
      brokers: { type: 'string' },
      topic: { type: 'string' },
      user: { type: 'string', default: 'u_js' },
      agent: { type: 'string', default: 'agent-js' },
      key: { type: 'string' },
      tampered: { type: 'boolean', default: false },
      'dry-run': { type: 'boolean', default: false },
    },
  });
  if (!values.key || (!values['dry-run'] && (!values.brokers || !values.topic))) {
    process.stderr.write(
      'usage: bank-transfer.js (--brokers HOST:PORT --topic TOPIC | --dry-run) --key PKCS8.pem [--user U] [--tampered]\n',
    );
    process.exit(2);
  }
  const signer = DecisionSigner.fromPem(readFileSync(values.key));
  const publisher = values['dry-run']
    ? new EventPublisher({ kafka: printingKafka(), topic: 'dry-run' })
    : new EventPublisher({ brokers: values.brokers.split(','), topic: values.topic });
  const at = new Date().toISOString();
  const { ask, execute, hold, evidence } = decided(values.user, at);
  const common = { userId: values.user, agentId: values.agent, tool: TOOL, instruction: INSTRUCTION, evidence, userChecklist: CHECKLIST };
  const print = (kind, run, position) =>
    values['dry-run'] ||
    process.stdout.write(
      `${JSON.stringify({ kind, run_id: run.runId, action_key: run.events[0].action_key, ...position, decision_id: run.decision?.decision_id ?? null })}\n`,
    );
  await publisher.connect();
  try {
    const asked = buildRun({ ...common, record: ask });
    print('ask_user', asked, await publisher.publish(asked.events));
    const approved = buildRun({ ...common, record: execute, signer });
    print('execute', approved, await publisher.publish(approved.events));
    const outcome = buildOutcome(approved, { status: 'executed', result: 'ok', reason: 'executed' });
    print('executed', approved, await publisher.publish(outcome));
    const held = buildRun({ ...common, record: hold, attempts: { tool_attempt: 2 } });
    print('hold', held, await publisher.publish(held.events));
    if (values.tampered) {
      const run = buildRun({ ...common, record: execute, signer });
      const field = run.events.find((e) => e.event_type === 'field_resolved' && e.field.name === 'to_account');
      field.field.value = '9999999'; // after hashing: the chain no longer holds
      const careless = new EventPublisher({ kafka: publisher.kafka, topic: values.topic, validate: false });
      await careless.connect();
      try {
        print('tampered', run, await careless.publish(run.events));
      } finally {
        await careless.disconnect();
      }
    }
  } finally {
    await publisher.disconnect();
  }
}

if (process.argv[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href) {
  main().catch((error) => {
    process.stderr.write(`${error.stack ?? error}\n`);
    process.exit(1);
  });
}
