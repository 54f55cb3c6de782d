// Ed25519 decisions with node's crypto.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { DecisionSigner, SigningKeyError, formatTime, signedPayload, verifyDecision } from '../src/signing.js';

const decision = {
  decision_id: '6f1f2a52-3b8e-4a7c-9d51-0f5a0c1e2d3b',
  run_id: 'c0a8b6b4-6f0e-4a43-8a0e-6b9e7f4b1c2d',
  action_key: 'u_js:bank.transfer',
  tool_name: 'bank.transfer',
  arguments_digest: `sha256:${'a'.repeat(64)}`,
};

function signer(options) {
  const { privateKey } = generateKeyPairSync('ed25519');
  return DecisionSigner.fromPem(privateKey.export({ format: 'pem', type: 'pkcs8' }), options);
}

test('a signed decision verifies with the public key, and is dated by the clock', () => {
  const s = signer({ ttlSeconds: 60, clock: () => new Date('2026-08-11T09:12:00Z') });
  const envelope = s.sign(decision);
  assert.equal(envelope.algorithm, 'ed25519');
  assert.equal(envelope.key_id, s.keyId);
  assert.equal(envelope.issued_at, '2026-08-11T09:12:00.000000Z');
  assert.equal(envelope.expires_at, '2026-08-11T09:13:00.000000Z');
  assert.ok(verifyDecision(decision, envelope, s.publicKey));
});

test('every signed member is covered', () => {
  const s = signer();
  const envelope = s.sign(decision);
  for (const member of Object.keys(decision)) {
    assert.equal(verifyDecision({ ...decision, [member]: `${decision[member]}x` }, envelope, s.publicKey), false, member);
  }
  for (const member of ['key_id', 'issued_at', 'expires_at', 'nonce']) {
    assert.equal(verifyDecision(decision, { ...envelope, [member]: `${envelope[member]}x` }, s.publicKey), false, member);
  }
});

test('another key does not verify it', () => {
  const envelope = signer().sign(decision);
  assert.equal(verifyDecision(decision, envelope, signer().publicKey), false);
});

test('two signatures of one decision differ by nonce', () => {
  const s = signer();
  assert.notEqual(s.sign(decision).nonce, s.sign(decision).nonce);
});

test('the payload is bytes and holds no signature value', () => {
  const s = signer();
  const envelope = s.sign(decision);
  const payload = signedPayload(decision, envelope);
  assert.ok(Buffer.isBuffer(payload));
  assert.ok(!payload.toString().includes(envelope.value));
});

test('a key that is not an Ed25519 private key is refused by name', () => {
  const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  assert.throws(() => DecisionSigner.fromPem(privateKey.export({ format: 'pem', type: 'pkcs8' })), SigningKeyError);
  assert.throws(() => DecisionSigner.fromPem('not a key'), SigningKeyError);
});

test('times are RFC 3339 UTC with microseconds', () => {
  assert.equal(formatTime(new Date('2026-01-02T03:04:05.678Z')), '2026-01-02T03:04:05.678000Z');
});
