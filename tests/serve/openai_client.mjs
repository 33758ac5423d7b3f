// The official `openai` npm client against `megatron serve`: completions, chat, streaming
// (each stream's pieces must add up to the non-streamed answer) and a 400 naming its field.
// usage: node openai_client.mjs BASE_URL PROMPT  -> one JSON object on stdout
import OpenAI from 'openai';

const [base, prompt] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'none', maxRetries: 0 });
const out = {};
const models = await client.models.list();
out.model = models.data[0].id;
const c = await client.completions.create({ model: out.model, prompt, max_tokens: 12, temperature: 0 });
out.completion = c.choices[0].text;
out.completion_finish = c.choices[0].finish_reason;
out.usage = c.usage;
let streamed = '';
const cs = await client.completions.create({ model: out.model, prompt, max_tokens: 12, temperature: 0, stream: true });
for await (const chunk of cs) streamed += chunk.choices[0]?.text ?? '';
out.completion_stream = streamed;
const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: prompt }];
const ch = await client.chat.completions.create({ model: out.model, messages, max_tokens: 10, temperature: 0 });
out.chat = ch.choices[0].message.content;
out.chat_role = ch.choices[0].message.role;
let chs = '';
const st = await client.chat.completions.create({ model: out.model, messages, max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true } });
for await (const chunk of st) {
  if (chunk.usage) out.chat_stream_usage = chunk.usage;
  chs += chunk.choices[0]?.delta?.content ?? '';
}
out.chat_stream = chs;
try {
  await client.completions.create({ model: out.model, prompt, max_tokens: -3 });
  out.error = 'none';
} catch (e) {
  out.error = { status: e.status, param: e.param ?? e.error?.param };
}
console.log(JSON.stringify(out));
