// The reference skeleton (JavaScript) deciding the seed's bank transfer, as bench/engine.py does with
// ours: the same hooks (preflight/scenario.py), an in-memory {persist, load} storage, the recipient
// answered, `runPreflightAndRecord` timed over N runs. Usage: node bench/skeleton.js <skeleton.js> <N>
// Prints one JSON line: {"decisions_per_s": ..., "cpu_decisions_per_s": ..., "decision": ...}, the second by
// the process's CPU time (which other load on a shared machine disturbs less than the clock). The
// skeleton's file is not part of this project: `make reference-skeleton` fetches it into bench/.cache
// (see bench/README.md).
"use strict";
const path = require("path");
const [file, runs] = [process.argv[2], Number(process.argv[3] || 5000)];
const { createPreflight } = require(path.resolve(file));

const TEXT = "send 500,000 won to my landlord";
const TOOL = {
  name: "bank.transfer",
  description: "Transfers are final. Confirm the recipient before calling.",
  inputSchema: {
    type: "object",
    properties: { from_account: { type: "string" }, amount: { type: "integer" }, to_account: { type: "string" } },
    required: ["from_account", "amount", "to_account"],
  },
};
const hooks = {
  classifyWhenCase: () => "immediate",
  extractUserActionName: () => "send money to my landlord",
  confirmToolNameMatchesIntent: () => ({ approved: true, reason: "transfer is what the user asked for" }),
  extractFromInstruction: (field) =>
    field === "amount" ? { value: 500000, segment_index: 0, span: [TEXT.indexOf("500,000"), TEXT.indexOf("500,000") + 7] } : undefined,
  measureFromEnvironment: () => undefined,
  buildActionKey: (userId, fixed) => `${userId}:${fixed.c3_provider_action_name}`,
  applyFieldPolicy: (record) => record,
  validateFieldSchema: () => undefined,
  verifyUserChecklistItem: (item) => ({ ...item, status: "verified", source: "measured_data" }),
};
const records = new Map();
const storage = {
  persist: async (key, record) => { (records.get(key) ?? records.set(key, []).get(key)).push(record); },
  load: async (key) => [...(records.get(key) ?? [])].reverse().find((r) => r.execution_decision === "executed") ?? null,
};
const input = {
  userId: "u_01",
  instruction: [{ text: TEXT, trust: "user" }, { text: "", trust: "untrusted", origin: "gmail:msg_881" }],
  mcpTool: TOOL,
  preSetData: { from_account: { value: "1102534471", trust: "user" } },
  userChecklist: [{ id: "chk_limit", description: "within daily transfer limit" }],
  userAnswers: { to_account: "2200119" },
};

(async () => {
  const pf = createPreflight({ hooks, storage, strict: true });
  const first = await pf.runPreflightAndRecord(input);
  if (first.execution_decision !== "execute") throw new Error(`skeleton decided ${first.execution_decision}: ${first.reason}`);
  for (let i = 0; i < Math.min(runs, 2000); i++) await pf.runPreflightAndRecord(input); // warm the JIT
  records.clear();
  const start = process.hrtime.bigint();
  const cpu = process.cpuUsage();
  for (let i = 0; i < runs; i++) await pf.runPreflightAndRecord(input);
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  const used = process.cpuUsage(cpu);
  const cpuSeconds = (used.user + used.system) / 1e6;
  console.log(
    JSON.stringify({
      decisions_per_s: runs / seconds,
      cpu_decisions_per_s: runs / cpuSeconds,
      decision: first.execution_decision,
    })
  );
})();
