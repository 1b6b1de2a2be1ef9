// The official Node `openai` SDK's stream helper against the gateway: prints the assembled choices as JSON.
// Usage: NODE_PATH=<cache>/node/node_modules node stream_tool_calls.cjs <base url> <api key> <n>
const OpenAI = require("openai").default;

async function main() {
  const [baseURL, apiKey, n] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
  const stream = client.chat.completions.stream({
    model: "gemma",
    n: Number(n),
    messages: [{ role: "user", content: "weather and time in Paris?" }],
    tools: [
      { type: "function", function: { name: "get_weather", parameters: { type: "object", properties: {} } } },
      { type: "function", function: { name: "get_time", parameters: { type: "object", properties: {} } } },
    ],
  });
  const completion = await stream.finalChatCompletion();
  const choices = completion.choices.map((c) => ({
    index: c.index,
    tool_calls: (c.message.tool_calls || []).map((t) => ({ id: t.id, name: t.function.name, arguments: t.function.arguments })),
  }));
  process.stdout.write(JSON.stringify(choices));
}

main().catch((error) => {
  process.stderr.write(String(error && error.stack ? error.stack : error));
  process.exit(1);
});
