// The package's public API: build a run's events from an agent's record, sign its `execute` decision,
// publish runs and outcomes to the preflight-audit events topic.
export { GENESIS_HASH, SCHEMA_VERSION, CanonicalFormError, canonicalJson, chainProblems, eventHash, sealChain } from './chain.js';
export { ALGORITHM, DecisionSigner, SigningKeyError, formatTime, keyIdOf, signedPayload, verifyDecision } from './signing.js';
export { RunShapeError, blockedGate, buildOutcome, buildRun, closedRecord, digestOf } from './run.js';
export { EventPublisher, MessageShapeError, UNKEYED, assertMessageShape, encodeMessage, messageHeaders, messageKey } from './publisher.js';
export { ContractViolation, assertEvents, eventProblems } from './validate.js';
export { EVENT_DEFINITIONS, REQUIRED_MEMBERS, SCHEMA, SCHEMA_ID } from './contract.generated.js';
export { BaselineUnavailable, SkeletonStorage } from './skeleton.js';
