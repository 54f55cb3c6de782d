// The generated JSDoc and contract copy are the schema's, fresh.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { OUTPUT_PATH, SCHEMA_PATH, eventDefinitions, generate, typeOf } from '../scripts/generate-types.js';
import { EVENT_DEFINITIONS, REQUIRED_MEMBERS, SCHEMA } from '../src/contract.generated.js';

test('src/contract.generated.js is what the generator writes from the checked-in schema', () => {
  const fresh = generate(readFileSync(SCHEMA_PATH, 'utf8'));
  assert.equal(readFileSync(OUTPUT_PATH, 'utf8'), fresh, 'stale: run `npm run generate` in clients/js');
});

test('the carried contract is the schema itself', () => {
  assert.deepEqual(SCHEMA, JSON.parse(readFileSync(SCHEMA_PATH, 'utf8')));
});

test('every event type of the schema has a typedef and its required members', () => {
  const events = eventDefinitions(SCHEMA);
  assert.ok(Object.keys(events).length >= 12);
  assert.deepEqual(EVENT_DEFINITIONS, Object.fromEntries(Object.entries(events).sort()));
  const text = readFileSync(OUTPUT_PATH, 'utf8');
  for (const [type, name] of Object.entries(events)) {
    assert.match(text, new RegExp(`@typedef \\{Object\\} ${name}\\n`), type);
    assert.deepEqual(REQUIRED_MEMBERS[type], [...SCHEMA.$defs[name].required].sort());
  }
});

test('a changed schema makes a different file', () => {
  const schema = JSON.parse(readFileSync(SCHEMA_PATH, 'utf8'));
  const [name] = Object.values(eventDefinitions(schema));
  schema.$defs[name].properties.added_member = { type: 'string' };
  assert.notEqual(generate(JSON.stringify(schema)), readFileSync(OUTPUT_PATH, 'utf8'));
});

test('schema types read as JSDoc types', () => {
  const defs = { Sig: {} };
  assert.equal(typeOf({ anyOf: [{ type: 'string' }, { type: 'null' }] }, defs), 'string|null');
  assert.equal(typeOf({ type: 'array', items: { type: 'integer' } }, defs), 'Array<number>');
  assert.equal(typeOf({ enum: ['a', 'b'] }, defs), '"a"|"b"');
  assert.equal(typeOf({ $ref: '#/$defs/Sig' }, defs), 'Sig');
  assert.equal(typeOf({ type: 'object', properties: { a: { type: 'boolean' } }, required: ['a'] }, defs), '{a: boolean}');
});
