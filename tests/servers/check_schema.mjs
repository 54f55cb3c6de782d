// Compile the event contract in ajv's strict mode (draft 2020-12, ajv-formats) and validate events with it.
// Usage: node check_schema.mjs SCHEMA.json < events.jsonl -- prints one JSON line per event: {"valid": bool, "errors": [...]}.
// A schema that does not compile in strict mode exits non-zero with ajv's message.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const Ajv2020 = require("ajv/dist/2020").default;
const addFormats = require("ajv-formats").default;

const ajv = new Ajv2020({ strict: true, allErrors: false });
addFormats(ajv);
const schema = JSON.parse(readFileSync(process.argv[2], "utf8"));
let validate;
try {
  validate = ajv.compile(schema);
} catch (error) {
  console.error(`strict compile failed: ${error.message}`);
  process.exit(2);
}
const input = readFileSync(0, "utf8");
for (const line of input.split("\n")) {
  if (!line.trim()) continue;
  const valid = validate(JSON.parse(line));
  const errors = valid ? [] : validate.errors.map((e) => `${e.instancePath} ${e.message}`);
  process.stdout.write(JSON.stringify({ valid, errors }) + "\n");
}
