// The OpenAI Node SDK (npm `openai` v6) against `epmoe serve`, as an application would use it:
// models.list, completions (text and token-id prompts, logprobs, seed, n), chat completions
// (logprobs / top_logprobs), streaming of both (deltas, stream_options.include_usage), stop
// strings, refusals (BadRequestError naming the field), a stream the client abandons, and the
// Responses API (client.responses, streamed and not).
//
// Run: python3 tests/serve/serve_harness.py -- node tests/serve/openai_client_test.mjs
// (the harness sets EPMOE_URL and EPMOE_MODEL_NAME). The model is random: the checks are on
// structure and on real values (lengths, id ranges, negative finite log-probs, the same seed giving
// the same bits, usage equal to the token counts, finish reasons).
// One line per check; the exit status is 1 when any check failed.
import OpenAI, { BadRequestError } from './clients/node_modules/openai/index.mjs';

const URL_ = process.env.EPMOE_URL;
const MODEL = process.env.EPMOE_MODEL_NAME;
if (!URL_ || !MODEL) {
  console.error('EPMOE_URL and EPMOE_MODEL_NAME must be set (run through serve_harness.py)');
  process.exit(2);
}
const CONTEXT = 4096;  // max_position_embeddings of the harness's text model

const client = new OpenAI({ baseURL: URL_ + '/v1', apiKey: 'sk-epmoe-test', maxRetries: 0, timeout: 120_000 });

let failures = 0;
let checks = 0;
function check(name, ok, detail = '') {
  checks++;
  if (ok) {
    console.log(`ok   ${name}`);
  } else {
    failures++;
    console.log(`FAIL ${name}${detail ? ': ' + detail : ''}`);
  }
  return ok;
}
const show = (x) => {
  const s = JSON.stringify(x);
  return s && s.length > 300 ? s.slice(0, 300) + '...' : s;
};
const eq = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const isLogprob = (x) => typeof x === 'number' && Number.isFinite(x) && x <= 0;
const utf8 = new TextDecoder('utf-8', { fatal: true });
// Code points, as the server's text_offset counts them (Python's len()).
const chars = (s) => [...s].length;
const special = (t) => /^<\|.*\|>$/.test(t);
// Token counts of two usages (cached_tokens may differ: the second run finds the first's prompt
// blocks in the prefix cache); cached_tokens must be a count within the prompt.
const sameCounts = (a, b) => !!a && !!b && a.prompt_tokens === b.prompt_tokens &&
  a.completion_tokens === b.completion_tokens && a.total_tokens === b.total_tokens &&
  Number.isInteger(a.prompt_tokens_details?.cached_tokens ?? 0) &&
  (a.prompt_tokens_details?.cached_tokens ?? 0) <= a.prompt_tokens;

// A section whose exception (a refusal, a dropped connection) is one failure, not the end.
async function section(name, fn) {
  try {
    await fn();
  } catch (e) {
    check(`${name} (no exception)`, false, `${e?.constructor?.name}: ${e?.message}`);
  }
}

async function metrics() {
  const r = await fetch(URL_ + '/metrics');
  const out = {};
  for (const line of (await r.text()).split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    const key = line.slice(0, i).replace(/model="[^"]*",?/, '').replace('{}', '');
    out[key] = Number(line.slice(i + 1));
  }
  return out;
}

// sglang's native /generate, only to learn how the server tokenized a text (the SDK sends text).
async function nativeGenerate(body) {
  const r = await fetch(URL_ + '/generate', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  if (r.status !== 200) throw new Error(`/generate ${r.status}: ${await r.text()}`);
  return r.json();
}

// Checks of one completions logprobs object against its choice (n tokens, top `top`).
function checkCompletionLogprobs(tag, choice, n, top) {
  const lp = choice.logprobs;
  if (!check(`${tag}: logprobs object present`, lp && Array.isArray(lp.tokens), show(lp))) return;
  check(`${tag}: ${n} tokens / token_logprobs / top_logprobs / text_offset`,
    lp.tokens.length === n && lp.token_logprobs.length === n && lp.top_logprobs.length === n &&
    lp.text_offset.length === n,
    `tokens ${lp.tokens.length} token_logprobs ${lp.token_logprobs.length} top ${lp.top_logprobs.length} ` +
    `offsets ${lp.text_offset.length}, expected ${n}`);
  check(`${tag}: token_logprobs negative and finite`, lp.token_logprobs.every(isLogprob), show(lp.token_logprobs));
  let topOk = true, topWhy = '';
  lp.top_logprobs.forEach((alts, i) => {
    const vals = Object.values(alts ?? {});
    // Distinct ids can share a text (bytes that are not UTF-8 show as U+FFFD), so keys may merge.
    if (vals.length < 1 || vals.length > top || !vals.every(isLogprob)) {
      topOk = false; topWhy = `step ${i}: ${show(alts)}`;
    } else if (lp.token_logprobs[i] > Math.max(...vals)) {
      topOk = false; topWhy = `step ${i}: the chosen token's ${lp.token_logprobs[i]} beats the best ${show(alts)}`;
    }
  });
  check(`${tag}: top_logprobs has 1..${top} entries, none below the chosen token's`, topOk, topWhy);
  let offOk = lp.text_offset[0] === 0, offWhy = `first ${lp.text_offset[0]}`;
  for (let i = 1; i < n && offOk; i++)
    if (lp.text_offset[i] < lp.text_offset[i - 1]) { offOk = false; offWhy = `step ${i}: ${show(lp.text_offset)}`; }
  check(`${tag}: text_offset starts at 0 and never decreases`, offOk, offWhy);
  // Where every token is whole UTF-8 and none is special, the text is the tokens one after another.
  const plain = lp.tokens.every((t) => !t.includes('\uFFFD') && !special(t));
  if (plain) {
    check(`${tag}: text == tokens joined`, choice.text === lp.tokens.join(''),
      `${show(choice.text)} vs ${show(lp.tokens.join(''))}`);
    let o = 0, ok = true;
    lp.tokens.forEach((t, i) => { if (lp.text_offset[i] !== o) ok = false; o += chars(t); });
    check(`${tag}: text_offset[i] == characters of tokens before i`, ok, show(lp.text_offset));
  }
}

async function main() {
  const t0 = Date.now();

  // ---------------------------------------------------------------- models.list
  await section('models.list', async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m);
    check('models.list: one model', ids.length === 1, show(ids));
    check(`models.list: id is ${MODEL}`, ids[0]?.id === MODEL, show(ids[0]));
    check('models.list: object "model"', ids[0]?.object === 'model', show(ids[0]));
  });

  // ---------------------------------------------------------------- completions, text prompt
  const PROMPT = 'The quick brown fox jumps over the lazy dog';
  let textPromptTokens = 0;
  await section('completions (text)', async () => {
    const params = { model: MODEL, prompt: PROMPT, max_tokens: 12, logprobs: 3, seed: 1234, temperature: 1.0,
      ignore_eos: true };  // ignore_eos: an sglang/vLLM extension, sent as an extra body field
    const a = await client.completions.create(params);
    const b = await client.completions.create(params);
    check('completions: object text_completion, id cmpl-*, model echoed',
      a.object === 'text_completion' && a.id.startsWith('cmpl-') && a.model === MODEL, show({ ...a, choices: 0 }));
    check('completions: one choice, index 0', a.choices.length === 1 && a.choices[0].index === 0, show(a.choices));
    const c = a.choices[0];
    check('completions: finish_reason "length" at max_tokens with ignore_eos', c.finish_reason === 'length',
      c.finish_reason);
    check('completions: usage.completion_tokens == max_tokens', a.usage.completion_tokens === 12, show(a.usage));
    check('completions: usage.total == prompt + completion, prompt > 0',
      a.usage.prompt_tokens > 0 && a.usage.total_tokens === a.usage.prompt_tokens + a.usage.completion_tokens,
      show(a.usage));
    textPromptTokens = a.usage.prompt_tokens;
    checkCompletionLogprobs('completions text', c, 12, 3);
    // The same seed: the same text, tokens and log-prob bits (the JSON keeps the fp32 exact).
    const d = b.choices[0];
    check('completions: same seed -> same text', d.text === c.text, `${show(c.text)} vs ${show(d.text)}`);
    check('completions: same seed -> same tokens', eq(d.logprobs?.tokens, c.logprobs?.tokens));
    check('completions: same seed -> same token_logprobs bits', eq(d.logprobs?.token_logprobs, c.logprobs?.token_logprobs),
      `${show(c.logprobs?.token_logprobs)} vs ${show(d.logprobs?.token_logprobs)}`);
    check('completions: same seed -> same top_logprobs', eq(d.logprobs?.top_logprobs, c.logprobs?.top_logprobs));
    // Another seed: another sample (12 tokens out of 3000 agreeing by chance is not a thing).
    const e = await client.completions.create({ ...params, seed: 4321 });
    check('completions: another seed -> other tokens', !eq(e.choices[0].logprobs?.tokens, c.logprobs?.tokens),
      show(e.choices[0].logprobs?.tokens));
    // What the server counted as the prompt is what its tokenizer makes of the text.
    const g = await nativeGenerate({ text: PROMPT, sampling_params: { max_new_tokens: 0 } });
    check('completions: usage.prompt_tokens == the prompt\'s tokens (/generate of the same text)',
      a.usage.prompt_tokens === g.meta_info.prompt_tokens, `${a.usage.prompt_tokens} vs ${g.meta_info.prompt_tokens}`);
  });

  // ---------------------------------------------------------------- completions, token ids, n 2
  await section('completions (token ids)', async () => {
    const ids = [17, 523, 1200, 2999, 4, 88, 640];
    const params = { model: MODEL, prompt: ids, max_tokens: 8, logprobs: 2, seed: 77, ignore_eos: true };
    const a = await client.completions.create(params);
    check('completions ids: usage.prompt_tokens == number of ids', a.usage.prompt_tokens === ids.length, show(a.usage));
    check('completions ids: finish_reason length, 8 tokens',
      a.choices[0].finish_reason === 'length' && a.usage.completion_tokens === 8, show(a.usage));
    checkCompletionLogprobs('completions ids', a.choices[0], 8, 2);

    // n 2: two choices, indexes 0 and 1; sample j draws with seed + j, so choice 1 of seed 77 is
    // choice 0 of seed 78 (and the batch of two gives each the bits it has alone).
    const n2 = await client.completions.create({ ...params, n: 2 });
    check('completions n=2: two choices, indexes 0, 1',
      n2.choices.length === 2 && eq(n2.choices.map((c) => c.index).sort(), [0, 1]), show(n2.choices.map((c) => c.index)));
    const byIndex = (r, i) => r.choices.find((c) => c.index === i);
    check('completions n=2: usage counts both samples', n2.usage.completion_tokens === 16 &&
      n2.usage.prompt_tokens === ids.length && n2.usage.total_tokens === ids.length + 16, show(n2.usage));
    const c0 = byIndex(n2, 0), c1 = byIndex(n2, 1);
    check('completions n=2: choice 0 == the n=1 request with the same seed',
      c0 && eq(c0.logprobs?.token_logprobs, a.choices[0].logprobs?.token_logprobs) && c0.text === a.choices[0].text,
      `${show(c0?.logprobs?.token_logprobs)} vs ${show(a.choices[0].logprobs?.token_logprobs)}`);
    const b = await client.completions.create({ ...params, seed: 78 });
    check('completions n=2: choice 1 == the n=1 request with seed + 1',
      c1 && eq(c1.logprobs?.token_logprobs, b.choices[0].logprobs?.token_logprobs) && c1.text === b.choices[0].text,
      `${show(c1?.logprobs?.token_logprobs)} vs ${show(b.choices[0].logprobs?.token_logprobs)}`);
    check('completions n=2: the two samples differ', !eq(c0?.logprobs?.tokens, c1?.logprobs?.tokens));
  });

  // ---------------------------------------------------------------- chat completions
  const MESSAGES = [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Name three colours.' },
  ];
  const CHATML = '<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nName three colours.<|im_end|>\n' +
    '<|im_start|>assistant\n';
  let chatRef = null;
  const chatParams = { model: MODEL, messages: MESSAGES, max_tokens: 10, logprobs: true, top_logprobs: 2, seed: 99,
    ignore_eos: true };
  await section('chat', async () => {
    const a = await client.chat.completions.create(chatParams);
    chatRef = a;
    check('chat: object chat.completion, id chatcmpl-*, model echoed',
      a.object === 'chat.completion' && a.id.startsWith('chatcmpl-') && a.model === MODEL, show({ ...a, choices: 0 }));
    const c = a.choices[0];
    check('chat: one choice, assistant message, finish_reason length',
      a.choices.length === 1 && c.message.role === 'assistant' && typeof c.message.content === 'string' &&
      c.finish_reason === 'length', show(c));
    check('chat: usage completion_tokens == max_tokens, total == prompt + completion',
      a.usage.completion_tokens === 10 && a.usage.total_tokens === a.usage.prompt_tokens + 10, show(a.usage));
    const content = c.logprobs?.content;
    if (check('chat: logprobs.content has one entry per token', Array.isArray(content) && content.length === 10,
      show(c.logprobs))) {
      let ok = true, why = '';
      for (const [i, e] of content.entries()) {
        const shape = typeof e.token === 'string' && isLogprob(e.logprob) && Array.isArray(e.bytes) &&
          e.bytes.length > 0 && e.bytes.every((x) => Number.isInteger(x) && x >= 0 && x <= 255) &&
          Array.isArray(e.top_logprobs) && e.top_logprobs.length === 2 &&
          e.top_logprobs.every((t) => typeof t.token === 'string' && isLogprob(t.logprob) && Array.isArray(t.bytes));
        if (!shape) { ok = false; why = `entry ${i}: ${show(e)}`; break; }
        if (e.top_logprobs[0].logprob < e.top_logprobs[1].logprob || e.logprob > e.top_logprobs[0].logprob) {
          ok = false; why = `entry ${i}: top_logprobs not sorted or below the chosen token: ${show(e)}`; break;
        }
      }
      check('chat: content[] {token, logprob<=0, bytes 0..255, top_logprobs[2] sorted, >= chosen}', ok, why);
      // bytes are the token's raw bytes: decoded they are the token string, where they are UTF-8.
      let bOk = true, bWhy = '', whole = 0;
      for (const e of [...content, ...content.flatMap((x) => x.top_logprobs)]) {
        let text = null;
        try { text = utf8.decode(Uint8Array.from(e.bytes)); } catch { /* a piece of a character */ }
        if (text !== null) {
          whole++;
          if (text !== e.token) { bOk = false; bWhy = `${show(e.bytes)} decodes to ${show(text)}, token ${show(e.token)}`; }
        } else if (!e.token.includes('\uFFFD')) {
          bOk = false; bWhy = `bytes ${show(e.bytes)} are not UTF-8 but the token is ${show(e.token)}`;
        }
      }
      check(`chat: bytes decode to the token string (${whole} of ${content.length * 3} whole UTF-8)`, bOk && whole > 0,
        bWhy || 'no token was whole UTF-8');
      if (content.every((e) => !e.token.includes('\uFFFD') && !special(e.token)))
        check('chat: message.content == tokens joined', c.message.content === content.map((e) => e.token).join(''),
          `${show(c.message.content)} vs ${show(content.map((e) => e.token).join(''))}`);
    }
    // The prompt is Qwen's ChatML: /generate of that text with the same seed samples the same reply.
    const g = await nativeGenerate({ text: CHATML, sampling_params: { max_new_tokens: 10, sampling_seed: 99,
      ignore_eos: true } });
    check('chat: usage.prompt_tokens == tokens of the ChatML prompt', a.usage.prompt_tokens === g.meta_info.prompt_tokens,
      `${a.usage.prompt_tokens} vs ${g.meta_info.prompt_tokens}`);
    check('chat: the reply == /generate of the ChatML prompt with the same seed', g.text === c.message.content,
      `${show(g.text)} vs ${show(c.message.content)}`);
    const b = await client.chat.completions.create(chatParams);
    check('chat: same seed -> same content and logprobs', b.choices[0].message.content === c.message.content &&
      eq(b.choices[0].logprobs, c.logprobs));
    // The repeated prompt's whole KV blocks come from the prefix cache (never its last token).
    const cached = b.usage.prompt_tokens_details?.cached_tokens;
    check('chat: the repeat reports cached prompt tokens (0 < cached < prompt_tokens)',
      Number.isInteger(cached) && cached > 0 && cached < b.usage.prompt_tokens, show(b.usage));
  });

  // ---------------------------------------------------------------- streaming completions
  await section('stream completions', async () => {
    const params = { model: MODEL, prompt: PROMPT, max_tokens: 20, seed: 2024, logprobs: 1, ignore_eos: true };
    const whole = await client.completions.create(params);
    const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
    let text = '', tokens = [], lps = [], finish = null, usage = null, chunks = 0, afterUsage = 0, ids = new Set();
    for await (const ch of stream) {
      chunks++;
      ids.add(ch.id);
      if (usage) afterUsage++;
      if (ch.usage) usage = ch.usage;
      for (const c of ch.choices ?? []) {
        text += c.text ?? '';
        if (c.logprobs) { tokens.push(...c.logprobs.tokens); lps.push(...c.logprobs.token_logprobs); }
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    const w = whole.choices[0];
    // (At least a content chunk and the usage chunk: tokens made between two writes of the server
    // share one event, so how many chunks 20 tokens take depends on timing -- on a loaded machine
    // all of them can arrive in one.)
    check(`stream completions: ${chunks} chunks, one id`, chunks >= 2 && ids.size === 1, `${chunks} chunks, ids ${show([...ids])}`);
    check('stream completions: deltas joined == the non-streamed text', text === w.text, `${show(text)} vs ${show(w.text)}`);
    check('stream completions: tokens and logprob bits == non-streamed',
      eq(tokens, w.logprobs.tokens) && eq(lps, w.logprobs.token_logprobs), `${show(lps)} vs ${show(w.logprobs.token_logprobs)}`);
    check('stream completions: finish_reason length', finish === 'length', finish);
    check('stream completions: a final usage chunk equal to the non-streamed usage',
      afterUsage === 0 && sameCounts(usage, whole.usage), `${show(usage)} vs ${show(whole.usage)}, ${afterUsage} after`);
  });

  // ---------------------------------------------------------------- streaming chat
  await section('stream chat', async () => {
    if (!chatRef) throw new Error('no non-streamed chat reply to compare with');
    const stream = await client.chat.completions.create({ ...chatParams, stream: true,
      stream_options: { include_usage: true } });
    let text = '', role = null, finish = null, usage = null, content = [], chunks = 0, objects = new Set(), last = null;
    for await (const ch of stream) {
      chunks++;
      objects.add(ch.object);
      last = ch;
      if (ch.usage) usage = ch.usage;
      for (const c of ch.choices ?? []) {
        if (c.delta?.role) role = role ?? c.delta.role;
        text += c.delta?.content ?? '';
        if (c.logprobs?.content) content.push(...c.logprobs.content);
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    const w = chatRef.choices[0];
    check('stream chat: chunks are chat.completion.chunk', objects.size === 1 && objects.has('chat.completion.chunk'),
      show([...objects]));
    check('stream chat: a delta gives role assistant', role === 'assistant', role);
    check('stream chat: deltas joined == the non-streamed content', text === w.message.content,
      `${show(text)} vs ${show(w.message.content)}`);
    check('stream chat: logprobs.content joined == non-streamed (tokens, bits, bytes, top)',
      eq(content, w.logprobs.content), `${show(content.slice(0, 2))} vs ${show(w.logprobs.content.slice(0, 2))}`);
    check('stream chat: finish_reason length', finish === 'length', finish);
    check('stream chat: the last chunk carries usage (choices empty) == non-streamed usage',
      last && last.usage && (last.choices ?? []).length === 0 && sameCounts(usage, chatRef.usage),
      `${show(last)} vs ${show(chatRef.usage)}`);
  });

  // ---------------------------------------------------------------- stop strings
  await section('stop strings', async () => {
    const params = { model: MODEL, prompt: PROMPT, max_tokens: 40, seed: 555, ignore_eos: true };
    const free = (await client.completions.create(params)).choices[0];
    const T = free.text;
    // A 3-character ASCII window from the middle of that text: generation with the same seed makes the
    // same text and must end right before the window's first occurrence.
    let stop = null;
    for (let k = Math.floor(T.length / 2); k + 3 <= T.length && !stop; k++) {
      const w = T.slice(k, k + 3);
      if (/^[\x21-\x7e][\x20-\x7e]{2}$/.test(w)) stop = w;
    }
    for (let k = Math.floor(T.length / 2); k > 0 && !stop; k--) {
      const w = T.slice(k, k + 3);
      if (/^[\x21-\x7e][\x20-\x7e]{2}$/.test(w)) stop = w;
    }
    if (!check('stop: found a printable window in the free text', stop !== null, show(T))) return;
    const r = await client.completions.create({ ...params, stop: [stop], logprobs: 0 });
    const c = r.choices[0];
    const cut = T.indexOf(stop);
    check(`stop ${show(stop)}: finish_reason "stop"`, c.finish_reason === 'stop', c.finish_reason);
    check(`stop ${show(stop)}: text == the free text up to the stop string`, c.text === T.slice(0, cut),
      `${show(c.text)} vs ${show(T.slice(0, cut))}`);
    check('stop: text does not contain the stop string', !c.text.includes(stop));
    check('stop: fewer tokens than the free run, usage == logprobs tokens',
      r.usage.completion_tokens < 40 && r.usage.completion_tokens === c.logprobs?.tokens?.length, show(r.usage));
    // As a plain string (not a list) too, and streamed: the streamed text never shows the stop string.
    const s = await client.completions.create({ ...params, stop, stream: true });
    let text = '', finish = null;
    for await (const ch of s) for (const x of ch.choices) { text += x.text ?? ''; finish = x.finish_reason ?? finish; }
    check('stop (streamed, string form): same text, finish_reason stop', text === c.text && finish === 'stop',
      `${show(text)} ${finish}`);
  });

  // ---------------------------------------------------------------- refusals
  await section('bad requests', async () => {
    const cases = [
      ['max_tokens -1', () => client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: -1 }), 'max_tokens'],
      ['unknown model', () => client.completions.create({ model: 'no-such-model', prompt: PROMPT, max_tokens: 2 }), 'model'],
      ['chat temperature -1', () => client.chat.completions.create({ model: MODEL, messages: MESSAGES, temperature: -1 }),
        'temperature'],
      ['token id outside the vocabulary', () => client.completions.create({ model: MODEL, prompt: [5, 3000], max_tokens: 2 }),
        'prompt'],
      ['prompt + max_tokens over the context',
        () => client.completions.create({ model: MODEL, prompt: [5, 6], max_tokens: CONTEXT + 10 }), 'max_tokens'],
    ];
    for (const [name, call, field] of cases) {
      let err = null;
      try {
        await call();
      } catch (e) {
        err = e;
      }
      check(`bad request (${name}): BadRequestError, status 400`, err instanceof BadRequestError && err.status === 400,
        err ? `${err.constructor.name} ${err.status}: ${err.message}` : 'no error');
      check(`bad request (${name}): the message names ${field}`, !!err && err.message.includes(field) &&
        err.param === field, err ? `message ${show(err.message)}, param ${show(err.param)}` : 'no error');
    }
    // The server still answers.
    const ok = await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 1 });
    check('bad requests: the server still serves', ok.choices.length === 1 && ok.usage.completion_tokens === 1);
  });

  // ---------------------------------------------------------------- a stream the client abandons
  await section('abort by closing the stream', async () => {
    const before = await metrics();
    const ids = [11, 22, 33];
    const maxTokens = CONTEXT - ids.length;  // seconds of work on this model: still running when we leave
    const stream = await client.completions.create({ model: MODEL, prompt: ids, max_tokens: maxTokens, stream: true,
      ignore_eos: true });
    let got = 0, text = '', finish = null;
    for await (const ch of stream) {
      for (const c of ch.choices) { text += c.text ?? ''; finish = c.finish_reason ?? finish; }
      if (++got >= 3) break;
    }
    stream.controller.abort();  // (leaving the loop already did; explicit as an application would)
    check('abort: read 3 chunks of an unfinished stream', got === 3 && finish === null, `${got} chunks, finish ${finish}`);
    const deadline = Date.now() + 10_000;
    let m = await metrics();
    while (Date.now() < deadline && !(m['epmoe_kv_blocks{state="used"}'] === 0 &&
      m['epmoe_requests_total{outcome="aborted"}'] > before['epmoe_requests_total{outcome="aborted"}'] &&
      m['epmoe_running_sequences'] === 0)) {
      await new Promise((r) => setTimeout(r, 100));
      m = await metrics();
    }
    check('abort: epmoe_requests_total{outcome="aborted"} grew within 10 s',
      m['epmoe_requests_total{outcome="aborted"}'] === before['epmoe_requests_total{outcome="aborted"}'] + 1,
      `${before['epmoe_requests_total{outcome="aborted"}']} -> ${m['epmoe_requests_total{outcome="aborted"}']}`);
    check('abort: no KV block used and nothing running afterwards',
      m['epmoe_kv_blocks{state="used"}'] === 0 && m['epmoe_running_sequences'] === 0,
      `used ${m['epmoe_kv_blocks{state="used"}']}, running ${m['epmoe_running_sequences']}`);
    check('abort: the generation stopped early (fewer tokens than asked)',
      m['epmoe_generation_tokens_total'] - before['epmoe_generation_tokens_total'] < maxTokens,
      `${m['epmoe_generation_tokens_total'] - before['epmoe_generation_tokens_total']} tokens generated`);
  });

  // The Responses API (client.responses, what the Vercel AI SDK's OpenAI provider calls by
  // default): the text of a greedy chat completion on the same turns, streamed as the same text.
  await section('responses', async () => {
    const input = [{ role: 'user', content: [{ type: 'input_text', text: 'Say something about the sea.' }] }];
    const chat = await client.chat.completions.create({
      model: MODEL, temperature: 0, max_tokens: 12,
      messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Say something about the sea.' }],
    });
    const r = await client.responses.create({ model: MODEL, instructions: 'Be brief.', input, temperature: 0,
      max_output_tokens: 12 });
    check('responses: object, id, one assistant message with output_text',
      r.object === 'response' && /^resp_/.test(r.id) && r.output.length === 1 && r.output[0].type === 'message' &&
      r.output[0].role === 'assistant' && r.output[0].content[0].type === 'output_text', show(r));
    check('responses: the text of the chat completion on the same turns (greedy)',
      r.output_text === chat.choices[0].message.content, `${show(r.output_text)} vs ${show(chat.choices[0].message.content)}`);
    check('responses: usage counts the chat completion\'s tokens',
      r.usage.input_tokens === chat.usage.prompt_tokens && r.usage.output_tokens === chat.usage.completion_tokens &&
      r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens, show(r.usage));
    const wantStatus = chat.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed';
    check('responses: status follows the finish (length: incomplete, max_output_tokens)',
      r.status === wantStatus && (wantStatus !== 'incomplete' || r.incomplete_details?.reason === 'max_output_tokens'),
      `${r.status} ${show(r.incomplete_details)}`);
    const stream = await client.responses.create({ model: MODEL, instructions: 'Be brief.', input, temperature: 0,
      max_output_tokens: 12, stream: true });
    const types = [];
    let text = '';
    let last = null;
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      last = ev;
    }
    check('responses stream: created first, then the deltas, the final event carrying the response',
      types[0] === 'response.created' && types.includes('response.output_text.delta') &&
      (last?.type === 'response.completed' || last?.type === 'response.incomplete') && last.response.status === r.status,
      show(types));
    check('responses stream: the deltas add up to the non-streamed text', text === r.output_text, `${show(text)}`);
    let refused = null;
    try {
      await client.responses.create({ model: MODEL, input: 'hi', previous_response_id: r.id });
    } catch (e) {
      refused = e;
    }
    check('responses: previous_response_id refused (BadRequestError naming it)',
      refused instanceof BadRequestError && /previous_response_id/.test(refused.message), `${refused?.message}`);
  });

  console.log(`${checks - failures}/${checks} checks passed in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
}

main().then(() => process.exit(failures ? 1 : 0), (e) => {
  console.log(`FAIL unexpected: ${e?.stack ?? e}`);
  process.exit(1);
});
