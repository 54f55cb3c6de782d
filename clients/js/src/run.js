// A run's events from what an agent decided: the record of the run (the seed's shape: fixed checklist,
// fields, user checklist, gate, decision) and the context the record does not hold (who, which tool,
// the shape of the instruction, each field's evidence). `buildRun` writes the events the contract asks
// for, in its order, sealed into one chain; `buildOutcome` the `executed` / `execution_failed` event that
// continues a closed run. Nothing here talks to a broker (see publisher.js).
import { randomUUID } from 'node:crypto';
import { SCHEMA_VERSION, canonicalJson, sealChain, sha256Hex } from './chain.js';
import { formatTime } from './signing.js';

/** A record or context this package cannot turn into a run (a named problem, nothing published). */
export class RunShapeError extends Error {
  constructor(message) {
    super(message);
    this.name = 'RunShapeError';
  }
}

/** The contract's digest of a JSON value: `sha256:` and the hex SHA-256 of its canonical JSON. */
export function digestOf(value) {
  return `sha256:${sha256Hex(canonicalJson(value))}`;
}

/**
 * What `run_closed` carries of the record: the members no other event holds (the rest -- fixed
 * checklist, fields, checklist, gate, decision -- is rebuilt from the run's events).
 */
export function closedRecord(record) {
  return {
    schema_version: String(record.schema_version),
    advisory_notes: record.advisory_notes ?? '',
    unknown_count: record.unknown_count ?? null,
    unverified_checklist_count: record.unverified_checklist_count ?? null,
    fields_computed: Array.isArray(record.fields),
    reason: record.reason,
    timestamp: record.timestamp,
  };
}

const DECISIONS = new Set(['execute', 'ask_user', 'hold', 'deferred']);

function envelope(ctx, eventType) {
  return {
    event_id: ctx.newId(),
    event_type: eventType,
    schema_version: SCHEMA_VERSION,
    run_id: ctx.runId,
    seq: 0,
    prev_hash: '',
    action_key: ctx.actionKey,
    user_id: ctx.userId,
    agent_id: ctx.agentId,
    occurred_at: ctx.now(),
  };
}

/** The instruction's shape as a run records it: never its text. */
function segmentShapes(instruction) {
  if (!Array.isArray(instruction)) return null;
  return instruction.map((s) => ({ trust: s.trust, origin: s.origin ?? null, length: [...(s.text ?? '')].length }));
}

/**
 * Which gate stopped a run, read from its record as SPEC 2.3 and 5 describe the gates: a gate `kind`
 * of `intent_undetermined*` is the intent gate (an instruction gap), `tool_undetermined*` the tool gate
 * (an action-definition gap); a null gate is a checklist without ids (a configuration defect) or, with a
 * reason starting `preflight error:`, the backstop (an internal error); anything else is the value gate
 * (unknown fields or unverified items: an instruction gap). `blocked` overrides any of the three.
 */
export function blockedGate(record, blocked = {}) {
  const gate = record.gate ?? null;
  const unknownFields = (gate?.unknown_fields ?? []).map((f) => f.name);
  const unverified = (gate?.unverified_checklist ?? []).map((i) => i.id);
  const kind = typeof gate?.kind === 'string' ? gate.kind : null;
  let derived;
  if (kind?.startsWith('intent_undetermined')) derived = ['intent', kind, 'instruction_gap'];
  else if (kind?.startsWith('tool_undetermined')) derived = ['tool', kind, 'action_definition_gap'];
  else if (gate === null && String(record.reason ?? '').startsWith('preflight error:')) {
    derived = ['backstop', 'preflight_error', 'internal_error'];
  } else if (gate === null) derived = ['checklist_ids', 'checklist_id_missing', 'configuration_defect'];
  else derived = ['value', kind ?? 'value_gate', 'instruction_gap'];
  return {
    gate_name: blocked.gate_name ?? derived[0],
    kind: blocked.kind ?? derived[1],
    gap_class: blocked.gap_class ?? derived[2],
    unknown_fields: unknownFields,
    unverified_items: unverified,
    gate,
  };
}

/**
 * The run's events, sealed.
 * @param {object} spec
 * @param {Record<string, any>} spec.record the run's record (SPEC 2.5: fixed, fields, user_checklist, gate,
 *   execution_decision, reason, ...)
 * @param {string|null} spec.userId
 * @param {string|null} [spec.agentId]
 * @param {{name: string, description?: string, inputSchema?: object}} spec.tool the MCP tool judged
 * @param {Array<{text: string, trust: string, origin?: string}>} [spec.instruction] only its shape is written
 * @param {Record<string, Record<string, any>>} [spec.evidence] per field name, where its value was read
 * @param {{intent_attempt?: number, tool_attempt?: number}} [spec.attempts]
 * @param {{gate_name?: string, kind?: string, gap_class?: string}} [spec.blocked] for ask_user / hold
 * @param {import('./signing.js').DecisionSigner} [spec.signer] signs an `execute` decision
 * @param {() => Date} [spec.clock]
 * @param {() => string} [spec.newId]
 * @returns {{runId: string, events: Array<import('./contract.generated.js').PreflightEvent>,
 *   decision: Record<string, any>|null}} `decision`: the approved decision of an `execute` run (its signed
 *   members, `arguments`, `signature`), else null
 */
export function buildRun(spec) {
  const { record } = spec;
  if (record === null || typeof record !== 'object') throw new RunShapeError('a run needs its record');
  const decision = record.execution_decision;
  if (!DECISIONS.has(decision)) throw new RunShapeError(`no run ends in ${JSON.stringify(decision)}`);
  const clock = spec.clock ?? (() => new Date());
  const ctx = {
    runId: spec.runId ?? randomUUID(),
    actionKey: record.action_key ?? null,
    userId: spec.userId ?? null,
    agentId: spec.agentId ?? null,
    newId: spec.newId ?? randomUUID,
    now: () => formatTime(clock()),
  };
  const tool = spec.tool;
  const attempts = spec.attempts ?? {};
  const events = [];
  events.push({
    ...envelope(ctx, 'run_started'),
    record_schema_version: String(record.schema_version),
    tool_name: tool?.name ?? null,
    tool_digest: tool ? digestOf(tool) : null,
    has_input_schema: tool ? tool.inputSchema !== undefined && tool.inputSchema !== null : null,
    instruction_segments: segmentShapes(spec.instruction),
    intent_fingerprint: spec.intentFingerprint ?? null,
    intent_attempt: attempts.intent_attempt ?? 0,
    tool_attempt: attempts.tool_attempt ?? 0,
    user_checklist: spec.userChecklist ?? record.user_checklist ?? [],
  });
  events.push({ ...envelope(ctx, 'fixed_checklist_resolved'), fixed: record.fixed ?? {}, issues: spec.issues ?? [] });
  const match = record.fixed?.c3_match;
  if (match && record.action_key !== null) {
    events.push({
      ...envelope(ctx, 'tool_match_decided'),
      tool_name: tool?.name ?? record.fixed.c3_provider_action_name,
      approved: match.approved === true,
      reason: match.reason ?? null,
      phase: record.phase,
    });
  }
  for (const field of record.fields ?? []) {
    events.push({ ...envelope(ctx, 'field_resolved'), field, evidence: spec.evidence?.[field.name] ?? {} });
  }
  if (record.phase === 'at_trigger' && Array.isArray(record.fields)) {
    (record.user_checklist ?? []).forEach((item, index) => {
      events.push({ ...envelope(ctx, 'checklist_item_verified'), index, item });
    });
  }
  let approved = null;
  if (decision === 'execute') {
    const args = Object.fromEntries((record.fields ?? []).map((f) => [f.name, f.value]));
    if (!tool?.name) throw new RunShapeError('an execute run needs the tool it judged');
    approved = {
      decision_id: spec.decisionId ?? randomUUID(),
      run_id: ctx.runId,
      action_key: ctx.actionKey,
      tool_name: tool.name,
      arguments_digest: digestOf(args),
    };
    const signature = spec.signer ? spec.signer.sign(approved) : undefined;
    const event = {
      ...envelope(ctx, 'execution_approved'),
      decision_id: approved.decision_id,
      tool_name: approved.tool_name,
      arguments_digest: approved.arguments_digest,
      gate: record.gate ?? {},
    };
    if (signature) event.signature = signature;
    approved = { ...approved, arguments: args, signature: signature ?? null };
    events.push(event);
  } else if (decision === 'deferred') {
    events.push({
      ...envelope(ctx, 'run_deferred'),
      pending_fields: (record.fields ?? []).filter((f) => f.pending_at_trigger).map((f) => f.name),
      deferred_input: record.deferred_input ?? {},
    });
  } else {
    events.push({ ...envelope(ctx, 'gate_blocked'), decision, ...blockedGate(record, spec.blocked) });
  }
  events.push({ ...envelope(ctx, 'run_closed'), decision, event_count: 0, last_hash: '', record: closedRecord(record) });
  return { runId: ctx.runId, events: sealChain(events), decision: approved };
}

/**
 * The outcome of an approved run's tool call, continuing the run's chain after its `run_closed`.
 * @param {{runId: string, events: Array<Record<string, any>>, decision: Record<string, any>}} run from `buildRun`
 * @param {{status: 'executed'|'failed', result?: any, error?: Error|string, reason?: string,
 *   clock?: () => Date, newId?: () => string}} outcome
 * @returns {Array<import('./contract.generated.js').Executed|import('./contract.generated.js').ExecutionFailed>}
 */
export function buildOutcome(run, outcome) {
  if (!run?.decision) throw new RunShapeError('only an approved (execute) run has an outcome');
  const closed = run.events.at(-1);
  if (closed?.event_type !== 'run_closed') throw new RunShapeError('the run is not closed');
  const clock = outcome.clock ?? (() => new Date());
  const ctx = {
    runId: run.runId,
    actionKey: closed.action_key,
    userId: closed.user_id,
    agentId: closed.agent_id,
    newId: outcome.newId ?? randomUUID,
    now: () => formatTime(clock()),
  };
  const base = {
    decision_id: run.decision.decision_id,
    tool_name: run.decision.tool_name,
    arguments_digest: run.decision.arguments_digest,
  };
  let event;
  if (outcome.status === 'executed') {
    event = {
      ...envelope(ctx, 'executed'),
      ...base,
      result_digest: digestOf(outcome.result ?? null),
      reason: outcome.reason ?? 'executed',
      timestamp: ctx.now(),
    };
  } else if (outcome.status === 'failed') {
    const error = outcome.error ?? 'failed';
    event = {
      ...envelope(ctx, 'execution_failed'),
      ...base,
      error_type: typeof error === 'string' ? 'Error' : error.name,
      error: typeof error === 'string' ? error : error.message,
      reason: outcome.reason ?? 'failed',
      timestamp: ctx.now(),
    };
  } else {
    throw new RunShapeError(`no outcome ${JSON.stringify(outcome.status)}`);
  }
  return sealChain([event], { prevHash: closed.hash, firstSeq: closed.seq + 1 });
}
