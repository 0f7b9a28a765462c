// Runs a checkout through the AG-UI protocol's own client, @ag-ui/client's HttpAgent
// (pinned in scripts/test), against POST /agui, and prints what it parsed as one JSON
// line: each run's events and outcome, and the agent's messages and pending interrupts.
// Usage: node run-agent.cjs URL THREAD_ID ORDER_ID AMOUNT [approve|deny]
// The client's path is in AGUI_CLIENT (target/tools/ag-ui/node_modules/@ag-ui/client).
const { HttpAgent } = require(process.env.AGUI_CLIENT);

const [url, threadId, orderId, amount, decision] = process.argv.slice(2);

async function run(agent, runId, resume) {
  const events = [];
  let outcome = null;
  await agent.runAgent(
    { runId, ...(resume ? { resume } : {}) },
    {
      onEvent: ({ event }) => {
        events.push(event);
      },
      onRunFinishedEvent: (params) => {
        outcome = params.outcome;
      },
    },
  );
  return { events, outcome };
}

(async () => {
  const agent = new HttpAgent({
    url,
    threadId,
    initialState: { orderId, amount, currency: "USD" },
    // The conversation says another order: the service must not read it.
    initialMessages: [
      { id: "u1", role: "user", content: "Please charge order NOT-THIS-ONE 999.00 USD" },
    ],
  });
  const runs = [await run(agent, "run-1")];
  if (decision && agent.pendingInterrupts.length > 0) {
    const interruptId = agent.pendingInterrupts[0].id;
    const payload = decision === "approve" ? { approve: true } : { approve: false, reason: "not today" };
    runs.push(await run(agent, "run-2", [{ interruptId, status: "resolved", payload }]));
  }
  console.log(
    JSON.stringify({
      runs,
      messages: agent.messages,
      pendingInterrupts: agent.pendingInterrupts,
    }),
  );
})().catch((err) => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});
