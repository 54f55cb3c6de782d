// RFC 8785 and the run's chain.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { GENESIS_HASH, CanonicalFormError, canonicalJson, chainProblems, eventHash, sealChain, sha256Hex } from '../src/chain.js';

test('keys sort by UTF-16 code units, not code points (RFC 8785 §3.2.3)', () => {
  // U+1F600 is D83D DE00 in UTF-16, before U+FFFF; by code point it would come after.
  assert.equal(canonicalJson({ '\uffff': 1, '\u{1F600}': 2, a: 3 }), '{"a":3,"\u{1F600}":2,"\uffff":1}');
});

test('numbers are written as ECMAScript writes them (RFC 8785 §3.2.2.3)', () => {
  assert.equal(canonicalJson([1e21, 1e-7, 0.1 + 0.2, -0, 5e-324, 100.0]), '[1e+21,1e-7,0.30000000000000004,0,5e-324,100]');
});

test("RFC 8785's own example", () => {
  const input = {
    numbers: [333333333.33333329, 1e30, 4.5, 2e-3, 0.000000000000000000000000001],
    string: '\u20ac$\u000F\u000aA\'\u0042\u0022\u005c\\"\/',
    literals: [null, true, false],
  };
  assert.equal(
    canonicalJson(input),
    '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}',
  );
});

test('what has no canonical form is refused by name', () => {
  for (const bad of [NaN, Infinity, { a: NaN }, '\ud800']) {
    assert.throws(() => canonicalJson(bad), CanonicalFormError);
  }
});

test('an event hash covers prev_hash, a newline and every member but hash', () => {
  const event = { b: 1, a: 'x', hash: 'ignored' };
  assert.equal(eventHash(GENESIS_HASH, event), sha256Hex(`${GENESIS_HASH}\n{"a":"x","b":1}`));
  assert.equal(eventHash(GENESIS_HASH, { ...event, hash: 'other' }), eventHash(GENESIS_HASH, event));
});

const run = () => [
  { event_type: 'run_started', n: 1 },
  { event_type: 'field_resolved', field: { name: 'amount', value: 500000 } },
  { event_type: 'run_closed', event_count: 0, last_hash: '' },
];

test('sealing numbers, links and closes a run', () => {
  const sealed = sealChain(run());
  assert.deepEqual(sealed.map((e) => e.seq), [0, 1, 2]);
  assert.equal(sealed[0].prev_hash, GENESIS_HASH);
  assert.equal(sealed[1].prev_hash, sealed[0].hash);
  assert.equal(sealed[2].event_count, 3);
  assert.equal(sealed[2].last_hash, sealed[1].hash);
  assert.deepEqual(chainProblems(sealed), []);
});

test('a value changed after hashing breaks the chain', () => {
  const sealed = sealChain(run());
  sealed[1].field.value = 900000;
  assert.deepEqual(chainProblems(sealed), ['event 1: hash does not match its content']);
});

test('a dropped or reordered event breaks the chain', () => {
  const sealed = sealChain(run());
  assert.notDeepEqual(chainProblems([sealed[0], sealed[2]]), []);
  assert.notDeepEqual(chainProblems([sealed[1], sealed[0], sealed[2]]), []);
});

test('an outcome continues its run', () => {
  const sealed = sealChain(run());
  const [outcome] = sealChain([{ event_type: 'executed' }], { prevHash: sealed[2].hash, firstSeq: 3 });
  assert.equal(outcome.seq, 3);
  assert.deepEqual(chainProblems([...sealed, outcome]), []);
});
