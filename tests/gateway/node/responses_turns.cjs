// The official Node `openai` SDK's responses.create against the gateway: a plain turn, a streamed turn continuing it
// by previous_response_id, and the stored first turn retrieved; prints what it saw as JSON.
// Usage: NODE_PATH=<cache>/node/node_modules node responses_turns.cjs <base url> <api key> <model>
const OpenAI = require("openai").default;

async function main() {
  const [baseURL, apiKey, model] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
  const first = await client.responses.create({ model, input: "Say hi.", max_output_tokens: 16 });
  const stream = await client.responses.create({
    model, input: "Again.", previous_response_id: first.id, max_output_tokens: 16, stream: true,
  });
  const types = [];
  let completed = null;
  for await (const event of stream) {
    types.push(event.type);
    if (event.type === "response.completed") completed = event.response;
  }
  const again = await client.responses.retrieve(first.id);
  process.stdout.write(JSON.stringify({
    first: { id: first.id, text: first.output_text, status: first.status, input_tokens: first.usage.input_tokens },
    types, second: { previous: completed.previous_response_id, input_tokens: completed.usage.input_tokens },
    retrieved: again.output_text,
  }));
}

main().catch((error) => {
  process.stderr.write(String(error && error.stack ? error.stack : error));
  process.exit(1);
});
