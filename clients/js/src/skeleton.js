// A storage port ({persist, load}) for the seed's public JavaScript reference skeleton
// (execution-state-preflight.js): a skeleton running in node is then audited by this backend.
//
// `persist(key, record)` publishes the record's run as events (a decision: `execute`, `ask_user`,
// `hold`, `deferred`) or, when the skeleton records `executed` / `failed` after its tool call, the
// outcome continuing the execute run it published last for that key. `load(key)` reads the fold
// worker's baseline (`GET /baseline/{key}`), waiting until the worker has folded this port's own last
// acknowledged message for the key (read-your-writes); a worker that cannot vouch for a baseline is an
// error (`BaselineUnavailable`), never "no baseline".
//
// The skeleton's record does not hold who asked, the tool's description, the instruction's shape, each
// field's evidence, or the tool's result: the port is built per agent session with the user and the
// tools, and `observe(callMcpTool)` wraps the tool call so the outcome carries its result's digest.
import { buildOutcome, buildRun } from './run.js';

/** The worker did not give a baseline it vouches for (starting, catching up, unreachable, malformed). */
export class BaselineUnavailable extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'BaselineUnavailable';
  }
}

const DECISIONS = new Set(['execute', 'ask_user', 'hold', 'deferred']);
const OUTCOMES = new Set(['executed', 'failed']);

export class SkeletonStorage {
  /**
   * @param {object} options
   * @param {import('./publisher.js').EventPublisher} options.publisher connected by the caller
   * @param {string} options.baselineUrl the fold worker's base URL (e.g. http://127.0.0.1:6066)
   * @param {string|null} options.userId whose runs these are
   * @param {string|null} [options.agentId]
   * @param {Array<{name: string}>} options.tools the MCP tools the skeleton may judge, as tools/list gives them
   * @param {Array<{text: string, trust: string, origin?: string}>} [options.instruction] its shape is recorded
   * @param {import('./signing.js').DecisionSigner} [options.signer] signs `execute` decisions
   * @param {number} [options.waitSeconds] how long the worker may take to catch up (default 5)
   */
  constructor({ publisher, baselineUrl, userId, agentId = null, tools, instruction, signer, waitSeconds = 5 }) {
    this.publisher = publisher;
    this.baselineUrl = baselineUrl.replace(/\/$/, '');
    this.userId = userId;
    this.agentId = agentId;
    this.tools = new Map(tools.map((t) => [t.name, t]));
    this.instruction = instruction;
    this.signer = signer;
    this.waitSeconds = waitSeconds;
    this.approved = new Map(); // key -> the last execute run published
    this.acked = new Map(); // key -> {partition, offset} of the last message published
    this.lastCall = null;
    this.persist = this.persist.bind(this);
    this.load = this.load.bind(this);
  }

  /** `callMcpTool` wrapped so that the outcome this port publishes carries the result's digest. */
  observe(callMcpTool) {
    return async (name, args) => {
      this.lastCall = null;
      try {
        const result = await callMcpTool(name, args);
        this.lastCall = { name, result };
        return result;
      } catch (error) {
        this.lastCall = { name, error };
        throw error;
      }
    };
  }

  async persist(key, record) {
    const decision = record?.execution_decision;
    let events;
    if (DECISIONS.has(decision)) {
      const tool = this.tools.get(record.fixed?.c3_provider_action_name) ?? null;
      const run = buildRun({
        record,
        userId: this.userId,
        agentId: this.agentId,
        tool,
        instruction: this.instruction,
        userChecklist: record.user_checklist ?? [],
        signer: decision === 'execute' ? this.signer : undefined,
      });
      if (decision === 'execute') this.approved.set(key, run);
      events = run.events;
    } else if (OUTCOMES.has(decision)) {
      const run = this.approved.get(key);
      if (!run) throw new Error(`no execute decision of this port under ${key} to record ${decision} for`);
      this.approved.delete(key);
      const call = this.lastCall?.name === run.decision.tool_name ? this.lastCall : null;
      this.lastCall = null;
      events = buildOutcome(run, {
        status: decision,
        result: call?.result ?? null,
        error: call?.error ?? record.reason,
        reason: record.reason,
      });
    } else {
      throw new Error(`a record whose execution_decision is ${JSON.stringify(decision)} is not a run`);
    }
    this.acked.set(key, await this.publisher.publish(events));
  }

  async load(key) {
    const url = new URL(`${this.baselineUrl}/baseline/${encodeURIComponent(key)}`);
    const acked = this.acked.get(key);
    if (acked) {
      url.searchParams.set('min_offset', String(acked.offset));
      url.searchParams.set('partition', String(acked.partition));
      url.searchParams.set('wait', String(this.waitSeconds));
    }
    let response;
    let body;
    try {
      response = await fetch(url);
      body = await response.json();
    } catch (error) {
      throw new BaselineUnavailable(`the fold worker did not answer for ${key}: ${error.message}`, { cause: error });
    }
    if (response.status !== 200) {
      throw new BaselineUnavailable(`the fold worker answered ${response.status} for ${key}: ${body?.reason ?? ''}`);
    }
    if (body?.status === 'none') return null;
    if (body?.status !== 'ok' || body.record === null || typeof body.record !== 'object') {
      throw new BaselineUnavailable(`the fold worker's baseline for ${key} is malformed`);
    }
    return body.record;
  }
}
