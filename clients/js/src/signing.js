// Signing `execute` decisions with Ed25519, by node's own `crypto`: the signature envelope the contract
// gives `execution_approved.signature` (algorithm, key id, validity period, nonce, value) over the payload
// the contract defines (`signedPayload`). The private key is a PKCS#8 PEM, as the backend's own signer
// keeps it; the consumers are given the matching public key (SPKI PEM, `publicKeyPem`).
import { createHash, createPrivateKey, createPublicKey, randomBytes, sign, verify } from 'node:crypto';
import { canonicalJson } from './chain.js';

/** The signature algorithm's name in the envelope. */
export const ALGORITHM = 'ed25519';

/** A key that is not an Ed25519 private key. */
export class SigningKeyError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'SigningKeyError';
  }
}

/** An RFC 3339 UTC time with microseconds, as the contract writes times. */
export function formatTime(date) {
  return date.toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
}

/** The domain tag that starts every signed payload (then a newline). */
export const PAYLOAD_TAG = 'preflight-audit/execute-decision/v1';

/** The key id of an Ed25519 public key: `ed25519:` and the first 16 hex digits of the SHA-256 of its raw 32 bytes. */
export function keyIdOf(publicKey) {
  const raw = publicKey.export({ format: 'jwk' }).x;
  return `ed25519:${createHash('sha256').update(Buffer.from(raw, 'base64url')).digest('hex').slice(0, 16)}`;
}

/**
 * The exact bytes that are signed: the domain tag, a newline, and the canonical JSON (UTF-8) of the
 * decision's members (`decision_id`, `run_id`, `action_key`, `tool_name`, `arguments_digest`) and the
 * envelope's (`issued_at`, `expires_at`, `nonce`, `key_id`, `algorithm`) -- exactly these ten.
 */
export function signedPayload(decision, envelope) {
  const members = {
    decision_id: decision.decision_id,
    run_id: decision.run_id,
    action_key: decision.action_key ?? null,
    tool_name: decision.tool_name,
    arguments_digest: decision.arguments_digest,
    issued_at: envelope.issued_at,
    expires_at: envelope.expires_at,
    nonce: envelope.nonce,
    key_id: envelope.key_id,
    algorithm: envelope.algorithm,
  };
  return Buffer.from(`${PAYLOAD_TAG}\n${canonicalJson(members)}`, 'utf8');
}

export class DecisionSigner {
  /**
   * @param {import('node:crypto').KeyObject} privateKey an Ed25519 private key
   * @param {{ttlSeconds?: number, clock?: () => Date}} [options] how long a decision is valid (default 300 s)
   */
  constructor(privateKey, { ttlSeconds = 300, clock = () => new Date() } = {}) {
    if (privateKey?.asymmetricKeyType !== 'ed25519' || privateKey.type !== 'private') {
      throw new SigningKeyError('a decision signer needs an Ed25519 private key');
    }
    this.privateKey = privateKey;
    this.publicKey = createPublicKey(privateKey);
    this.keyId = keyIdOf(this.publicKey);
    this.ttlSeconds = ttlSeconds;
    this.clock = clock;
  }

  /** A signer from a PKCS#8 PEM (text or bytes). */
  static fromPem(pem, options) {
    let key;
    try {
      key = createPrivateKey(pem);
    } catch (error) {
      throw new SigningKeyError(`not a PEM private key: ${error.message}`, { cause: error });
    }
    return new DecisionSigner(key, options);
  }

  /** The public key as an SPKI PEM, for the consumers' trusted keys. */
  publicKeyPem() {
    return this.publicKey.export({ format: 'pem', type: 'spki' });
  }

  /**
   * The signature envelope of `decision` ({decision_id, run_id, action_key, tool_name, arguments_digest}).
   * @returns {{algorithm: string, key_id: string, issued_at: string, expires_at: string, nonce: string, value: string}}
   */
  sign(decision) {
    const now = this.clock();
    const envelope = {
      algorithm: ALGORITHM,
      key_id: this.keyId,
      issued_at: formatTime(now),
      expires_at: formatTime(new Date(now.getTime() + this.ttlSeconds * 1000)),
      nonce: randomBytes(16).toString('hex'),
    };
    const value = sign(null, signedPayload(decision, envelope), this.privateKey).toString('base64url');
    return { ...envelope, value };
  }
}

/** Whether `envelope` is a valid signature of `decision` by `publicKey` (the consumers' check). */
export function verifyDecision(decision, envelope, publicKey) {
  if (envelope?.algorithm !== ALGORITHM) return false;
  return verify(null, signedPayload(decision, envelope), publicKey, Buffer.from(envelope.value, 'base64url'));
}
