// Publishing to the events topic with kafkajs, as the contract's transport says: one Kafka message per
// run (a JSON array of its events, `seq` 0 to `run_closed`) or per outcome (one `executed` or
// `execution_failed` continuing its closed run), keyed by the `action_key` (`__preflight_unkeyed__` when
// it is null), each event in its canonical bytes, with the contract's headers. Every event is checked against the contract and its chain
// before anything is sent; a message is acknowledged by all in-sync replicas before `publish` returns.
import { Kafka, logLevel } from 'kafkajs';
import { assertEvents } from './validate.js';
import { canonicalJson, chainProblems } from './chain.js';

/** The key of a message whose events have no `action_key`. */
export const UNKEYED = '__preflight_unkeyed__';

/** A message this package refuses to send (not one run or one outcome, or a broken chain). */
export class MessageShapeError extends Error {
  constructor(message) {
    super(message);
    this.name = 'MessageShapeError';
  }
}

/** The Kafka key of a message: its events' one `action_key`, or `UNKEYED`. */
export function messageKey(events) {
  const keys = new Set(events.map((e) => e.action_key ?? null));
  if (keys.size !== 1) throw new MessageShapeError(`one message carries one action_key, not ${[...keys].join(', ')}`);
  const [key] = keys;
  return key ?? UNKEYED;
}

/** The message's headers, as the contract's transport section lists them (the consumers do not need them). */
export function messageHeaders(events) {
  const last = events.at(-1);
  return {
    event_type: last.event_type,
    schema_version: String(last.schema_version),
    event_count: String(events.length),
    run_id: last.run_id,
  };
}

/** Checks that `events` form one whole run or one outcome; throws `MessageShapeError` otherwise. */
export function assertMessageShape(events) {
  if (!Array.isArray(events) || events.length === 0) throw new MessageShapeError('a message carries at least one event');
  const runIds = new Set(events.map((e) => e.run_id));
  if (runIds.size !== 1) throw new MessageShapeError('a message carries the events of one run');
  const outcome = events.length === 1 && ['executed', 'execution_failed'].includes(events[0].event_type);
  if (outcome) return;
  if (events[0].event_type !== 'run_started' || events.at(-1).event_type !== 'run_closed') {
    throw new MessageShapeError('a run message goes from run_started to run_closed');
  }
  const problems = chainProblems(events);
  if (problems.length > 0) throw new MessageShapeError(`the run's chain is broken: ${problems.join('; ')}`);
}

/**
 * The encoded message: (key, value, headers) as they go on the wire. Each event is written in the
 * canonical form it was hashed over (with `hash` in its sorted place), so the consumers check it on its
 * own bytes.
 */
export function encodeMessage(events) {
  return {
    key: messageKey(events),
    value: `[${events.map((e) => canonicalJson(e)).join(',')}]`,
    headers: messageHeaders(events),
  };
}

export class EventPublisher {
  /**
   * @param {{brokers: string[], topic: string, clientId?: string, kafka?: import('kafkajs').Kafka,
   *   validate?: boolean}} options `validate: false` sends without the contract check (for tests that
   *   must publish what a careless producer would)
   */
  constructor({ brokers, topic, clientId = 'preflight-js-producer', kafka, validate = true }) {
    this.topic = topic;
    this.validate = validate;
    this.kafka = kafka ?? new Kafka({ clientId, brokers, logLevel: logLevel.WARN });
    this.producer = this.kafka.producer({ allowAutoTopicCreation: false, idempotent: false });
    this.connected = false;
  }

  async connect() {
    await this.producer.connect();
    this.connected = true;
  }

  async disconnect() {
    if (this.connected) await this.producer.disconnect();
    this.connected = false;
  }

  /**
   * Publish one run (its sealed events) or one outcome. Resolves to the broker's (partition, offset).
   * @param {Array<Record<string, any>>} events
   */
  async publish(events) {
    if (this.validate) {
      assertMessageShape(events);
      assertEvents(events);
    }
    const message = encodeMessage(events);
    const [meta] = await this.producer.send({ topic: this.topic, acks: -1, messages: [message] });
    return { partition: meta.partition, offset: Number(meta.baseOffset ?? meta.offset) };
  }
}
