// The Vercel AI SDK (npm `ai` with `@ai-sdk/openai`) against `epmoe serve`, as an application uses
// it: the provider's default model calls the Responses API (/v1/responses), `.chat()` the chat
// completions route; generateText and streamText on both, greedy, so both routes must give the
// same text. Run through serve_harness.py (EPMOE_URL, EPMOE_MODEL_NAME).
import { generateText, streamText } from './clients/node_modules/ai/dist/index.js';
import { createOpenAI } from './clients/node_modules/@ai-sdk/openai/dist/index.js';

const URL_ = process.env.EPMOE_URL;
const MODEL = process.env.EPMOE_MODEL_NAME;
if (!URL_ || !MODEL) {
  console.error('EPMOE_URL and EPMOE_MODEL_NAME must be set (run through serve_harness.py)');
  process.exit(2);
}
let failures = 0;
function check(name, ok, detail = '') {
  if (ok) console.log(`ok   ${name}`);
  else {
    failures++;
    console.log(`FAIL ${name}${detail ? ': ' + detail : ''}`);
  }
}
const show = (x) => JSON.stringify(x)?.slice(0, 300);

const openai = createOpenAI({ baseURL: URL_ + '/v1', apiKey: 'sk-epmoe-test' });
const args = { system: 'Be brief.', prompt: 'Say something about the sea.', temperature: 0, maxOutputTokens: 12, maxRetries: 0 };

async function main() {
  const viaResponses = await generateText({ model: openai(MODEL), ...args });
  check('generateText (Responses API, the default): text and usage',
    typeof viaResponses.text === 'string' && viaResponses.text.length > 0 && viaResponses.usage.outputTokens > 0,
    show({ text: viaResponses.text, usage: viaResponses.usage }));
  const viaChat = await generateText({ model: openai.chat(MODEL), ...args });
  check('generateText (chat completions): the same greedy text as through the Responses API',
    viaChat.text === viaResponses.text, `${show(viaChat.text)} vs ${show(viaResponses.text)}`);
  check('usage: the same token counts on both routes',
    viaChat.usage.inputTokens === viaResponses.usage.inputTokens &&
    viaChat.usage.outputTokens === viaResponses.usage.outputTokens, show([viaChat.usage, viaResponses.usage]));
  for (const [name, model] of [['Responses API', openai(MODEL)], ['chat completions', openai.chat(MODEL)]]) {
    const s = streamText({ model, ...args });
    let text = '';
    for await (const delta of s.textStream) text += delta;
    const finish = await s.finishReason;
    check(`streamText (${name}): the deltas add up to the same text`, text === viaResponses.text, show(text));
    check(`streamText (${name}): a finish reason`, ['stop', 'length'].includes(finish), show(finish));
  }
  let refused = null;
  try {
    await generateText({ model: openai.chat(MODEL), ...args, presencePenalty: 3 });
  } catch (e) {
    refused = e;
  }
  check('an out-of-range setting is an error the SDK reports (400 naming presence_penalty)',
    refused !== null && /presence_penalty/.test(String(refused?.message) + String(refused?.responseBody)), String(refused));
}

main().then(() => process.exit(failures ? 1 : 0), (e) => {
  console.log(`FAIL unexpected: ${e?.stack ?? e}`);
  process.exit(1);
});
