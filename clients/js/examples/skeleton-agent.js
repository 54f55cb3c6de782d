#!/usr/bin/env node
// The seed's reference skeleton (execution-state-preflight.js, not part of this project: `make
// reference-skeleton` fetches its pinned file) deciding the bank transfer in node, audited by this
// backend through `SkeletonStorage`: every record it persists is published as a run (or an outcome), and
// its tier 4 reads the fold worker's baseline.
//
//   node examples/skeleton-agent.js --skeleton PATH --brokers HOST:PORT --topic TOPIC \
//        --baseline-url http://127.0.0.1:PORT --key decision.pem [--user u_sk]
//
// Two runs: the first has the recipient answered and executes; the second has no answer, and its tier 4
// takes the recipient from the baseline the first one left. Prints one JSON line per run:
// {run, decision, status, to_account: {value, source, origin_source}}.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { DecisionSigner, EventPublisher, SkeletonStorage } from '../src/index.js';
import { CHECKLIST, INSTRUCTION, TEXT, TOOL } from './bank-transfer.js';

const require = createRequire(import.meta.url);
const AMOUNT_SPAN = [TEXT.indexOf('500,000'), TEXT.indexOf('500,000') + '500,000'.length];

/** The well-behaved agent's hooks, in the skeleton's names. */
const hooks = {
  classifyWhenCase: () => 'immediate',
  extractUserActionName: () => 'send money to my landlord',
  confirmToolNameMatchesIntent: () => ({ approved: true, reason: 'transfer is what the user asked for' }),
  extractFromInstruction: (field) => (field === 'amount' ? { value: 500000, segment_index: 0, span: AMOUNT_SPAN } : undefined),
  measureFromEnvironment: () => undefined,
  buildActionKey: (userId, fixed) => `${userId}:${fixed.c3_provider_action_name}`,
  applyFieldPolicy: (record) => record, // tier 4 allowed: the second run inherits the recipient
  validateFieldSchema: () => undefined,
  verifyUserChecklistItem: (item) => ({ ...item, status: 'verified', source: 'measured_data' }),
};

async function main() {
  const { values } = parseArgs({
    options: {
      skeleton: { type: 'string' },
      brokers: { type: 'string' },
      topic: { type: 'string' },
      'baseline-url': { type: 'string' },
      key: { type: 'string' },
      user: { type: 'string', default: 'u_sk' },
    },
  });
  for (const name of ['skeleton', 'brokers', 'topic', 'baseline-url', 'key']) {
    if (!values[name]) {
      process.stderr.write(`missing --${name}\n`);
      process.exit(2);
    }
  }
  const { createPreflight } = require(resolve(values.skeleton));
  const publisher = new EventPublisher({ brokers: values.brokers.split(','), topic: values.topic });
  await publisher.connect();
  try {
    const storage = new SkeletonStorage({
      publisher,
      baselineUrl: values['baseline-url'],
      userId: values.user,
      agentId: 'skeleton',
      tools: [TOOL],
      instruction: INSTRUCTION,
      signer: DecisionSigner.fromPem(readFileSync(values.key)),
    });
    const pf = createPreflight({ hooks, storage, strict: true });
    const callTool = storage.observe(async () => ({ content: [{ type: 'text', text: 'ok' }] }));
    const input = {
      userId: values.user,
      instruction: INSTRUCTION,
      mcpTool: TOOL,
      preSetData: { from_account: { value: '1102534471', trust: 'user' } },
      userChecklist: CHECKLIST,
    };
    const runs = [
      { ...input, userAnswers: { to_account: '2200119' } },
      { ...input, priorExecutionState: null },
    ];
    for (const [i, runInput] of runs.entries()) {
      const prior = await pf.getPriorExecutionState(`${values.user}:${TOOL.name}`);
      const record = await pf.runPreflightAndRecord({ ...runInput, priorExecutionState: prior });
      let status = 'held';
      if (record.execution_decision === 'execute') status = (await pf.executeIfReady(record, TOOL, callTool)).status;
      const field = record.fields?.find((f) => f.name === 'to_account') ?? null;
      const toAccount = field && { value: field.value ?? null, source: field.source, origin_source: field.origin_source };
      process.stdout.write(`${JSON.stringify({ run: i, decision: record.execution_decision, status, to_account: toAccount })}\n`);
    }
  } finally {
    await publisher.disconnect();
  }
}

main().catch((error) => {
  process.stderr.write(`${error.stack ?? error}\n`);
  process.exit(1);
});
