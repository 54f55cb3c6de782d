#!/usr/bin/env node
// Reads JSON values, one a line, on stdin; prints for each its RFC 8785 canonical JSON and the chain
// hash of an event body made of its members and `schema_version: 3` linked to 64 zeros:
// {"canonical": "...", "hash": "..."}. For comparing the package's canonical form with another's.
import { createInterface } from 'node:readline';
import { GENESIS_HASH, SCHEMA_VERSION, canonicalJson, eventHash } from '../src/chain.js';

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const value = JSON.parse(line);
  const canonical = canonicalJson(value);
  const hash = eventHash(GENESIS_HASH, { ...value, schema_version: SCHEMA_VERSION });
  process.stdout.write(`${JSON.stringify({ canonical, hash })}\n`);
}
