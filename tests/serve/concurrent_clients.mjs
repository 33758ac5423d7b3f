// C clients x R requests each against `megatron serve` at once (Node's fetch), greedy:
// every answer must equal the expected text of its prompt. Mixes /api, /v1/completions and
// streamed /v1/completions.  usage: node concurrent_clients.mjs BASE_URL EXPECTED.json C R
import { readFileSync } from 'node:fs';

const [base, expectedFile, C, R] = process.argv.slice(2);
const expected = JSON.parse(readFileSync(expectedFile, 'utf8'));  // [{prompt, text}]
let bad = 0, done = 0;
async function one(k) {
  const e = expected[k % expected.length];
  const mode = k % 3;
  if (mode === 0) {
    const r = await fetch(base + '/api', { method: 'PUT', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompts: [e.prompt], tokens_to_generate: 16, top_k: 1 }) });
    const j = await r.json();
    return j.text?.[0] === e.prompt + e.continuation;
  }
  const body = { model: 'm', prompt: e.prompt, max_tokens: 16, temperature: 0, stream: mode === 2 };
  const r = await fetch(base + '/v1/completions', { method: 'POST', body: JSON.stringify(body) });
  if (mode === 1) return (await r.json()).choices?.[0]?.text === e.continuation;
  const sse = await r.text();
  let text = '';
  for (const line of sse.split('\n'))
    if (line.startsWith('data: {')) text += JSON.parse(line.slice(6)).choices[0].text;
  return sse.trimEnd().endsWith('data: [DONE]') && text === e.continuation;
}
await Promise.all([...Array(Number(C)).keys()].map(async (c) => {
  for (let r = 0; r < Number(R); ++r) {
    const k = c * Number(R) + r;
    if (!(await one(k))) { ++bad; console.error(`request ${k} (client ${c}) wrong`); }
    ++done;
  }
}));
console.log(JSON.stringify({ done, bad }));
