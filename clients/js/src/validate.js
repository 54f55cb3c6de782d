// Each event checked against the contract (the generated copy of events.schema.json) before it is sent:
// ajv in strict mode, draft 2020-12, with formats. A producer that would publish an invalid event gets a
// `ContractViolation` naming every problem instead, and nothing is sent.
import Ajv2020Module from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';
import { SCHEMA } from './contract.generated.js';

const Ajv2020 = Ajv2020Module.default ?? Ajv2020Module;
const addFormats = addFormatsModule.default ?? addFormatsModule;

/** An event the contract refuses: `problems` lists each (`/path: message`). */
export class ContractViolation extends Error {
  constructor(problems) {
    super(`not an event of the contract: ${problems.join('; ')}`);
    this.name = 'ContractViolation';
    this.problems = problems;
  }
}

let compiled = null;

/** The contract compiled once, in ajv's strict mode. */
export function contractValidator() {
  if (compiled === null) {
    const ajv = new Ajv2020({ strict: true, allErrors: true });
    addFormats(ajv);
    compiled = ajv.compile(SCHEMA);
  }
  return compiled;
}

/** The problems of `event` under the contract (empty when it is valid). */
export function eventProblems(event) {
  const validate = contractValidator();
  if (validate(event)) return [];
  return (validate.errors ?? []).map((e) => `${e.instancePath || '/'}: ${e.message}`);
}

/** Throws `ContractViolation` unless every event is valid under the contract. */
export function assertEvents(events) {
  const problems = events.flatMap((event, i) => eventProblems(event).map((p) => `event ${i} ${p}`));
  if (problems.length > 0) throw new ContractViolation(problems);
}
