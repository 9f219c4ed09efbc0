// The demo's client of `epmoe serve`: the OpenAI SDK (npm `openai` v6, installed by
// scripts/install-deps.sh into tests/serve/clients) as any application would use it.
// usage: node scripts/demo-serve-client.mjs http://127.0.0.1:PORT
import { createRequire } from 'node:module';
const require = createRequire(new URL('../tests/serve/clients/package.json', import.meta.url));
const OpenAI = require('openai').default ?? require('openai');

const base = process.argv[2];
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'unused' });
const model = (await client.models.list()).data[0].id;
console.log(`models: ${model}`);

process.stdout.write('chat (streamed): ');
const stream = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: 'Write a haiku about experts.' }],
  max_tokens: 24, temperature: 0.8, seed: 7, stream: true,
});
for await (const chunk of stream) process.stdout.write(chunk.choices[0]?.delta?.content ?? '');
process.stdout.write('\n');

const c = await client.completions.create({ model, prompt: 'The capital of France is', max_tokens: 6,
                                            temperature: 0, logprobs: 2 });
console.log(`completion: ${JSON.stringify(c.choices[0].text)}`);
c.choices[0].logprobs.tokens.forEach((t, i) =>
  console.log(`  ${JSON.stringify(t).padEnd(14)} logprob ${c.choices[0].logprobs.token_logprobs[i]}`));
console.log(`usage: ${JSON.stringify(c.usage)}`);
