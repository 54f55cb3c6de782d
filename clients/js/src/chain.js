// The run's hash chain (the contract's hash rule for schema version 3): each event's `hash` is the
// lower-case hex SHA-256 of its `prev_hash`, a newline, and the RFC 8785 canonical JSON (UTF-8) of every
// member but `hash`; a run's first event links to 64 zeros; `run_closed` states the run's event count and
// the hash before it. RFC 8785 is the `canonicalize` package's, not written here.
import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';

/** The `prev_hash` of a run's first event. */
export const GENESIS_HASH = '0'.repeat(64);

/** The schema version this package writes (the one whose hash rule is RFC 8785). */
export const SCHEMA_VERSION = 3;

/** A value the canonical form cannot write (NaN, an infinity, a lone surrogate, a cycle, undefined). */
export class CanonicalFormError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'CanonicalFormError';
  }
}

/** The RFC 8785 canonical JSON of `value`, as a string. */
export function canonicalJson(value) {
  let text;
  try {
    text = canonicalize(value);
  } catch (error) {
    throw new CanonicalFormError(`no canonical JSON for this value: ${error.message}`, { cause: error });
  }
  if (typeof text !== 'string') throw new CanonicalFormError(`no canonical JSON for ${typeof value}`);
  return text;
}

/** Lower-case hex SHA-256 of a string's UTF-8 bytes. */
export function sha256Hex(text) {
  return createHash('sha256').update(text, 'utf8').digest('hex');
}

/** The `hash` of `event` linked to `prevHash`: every member but `hash` itself is covered. */
export function eventHash(prevHash, event) {
  const { hash: _ignored, ...body } = event;
  return sha256Hex(`${prevHash}\n${canonicalJson(body)}`);
}

/**
 * The run's events numbered and chained: `seq` 0.., each `prev_hash` the hash before it (64 zeros
 * first), a `run_closed` given the run's `event_count` and `last_hash`, then each `hash`. Returns new
 * objects; `events` are not changed.
 * @template {Record<string, any>} T
 * @param {T[]} events
 * @param {{prevHash?: string, firstSeq?: number}} [from] where the chain continues (an outcome after its run)
 * @returns {T[]}
 */
export function sealChain(events, { prevHash = GENESIS_HASH, firstSeq = 0 } = {}) {
  let prev = prevHash;
  return events.map((event, i) => {
    const body = { ...event, seq: firstSeq + i, prev_hash: prev };
    delete body.hash;
    if (body.event_type === 'run_closed') {
      body.event_count = firstSeq + i + 1;
      body.last_hash = prev;
    }
    const hash = eventHash(prev, body);
    prev = hash;
    return { ...body, hash };
  });
}

/**
 * Check a run's chain as the consumers do; returns the problems (empty when it verifies).
 * @param {Array<Record<string, any>>} events
 * @param {{prevHash?: string, firstSeq?: number}} [from]
 * @returns {string[]}
 */
export function chainProblems(events, { prevHash = GENESIS_HASH, firstSeq = 0 } = {}) {
  const problems = [];
  let prev = prevHash;
  events.forEach((event, i) => {
    if (event.seq !== firstSeq + i) problems.push(`event ${i}: seq ${event.seq}, expected ${firstSeq + i}`);
    if (event.prev_hash !== prev) problems.push(`event ${i}: prev_hash does not link to the event before`);
    let expected;
    try {
      expected = eventHash(event.prev_hash, event);
    } catch (error) {
      problems.push(`event ${i}: ${error.message}`);
      return;
    }
    if (event.hash !== expected) problems.push(`event ${i}: hash does not match its content`);
    prev = event.hash;
  });
  return problems;
}
