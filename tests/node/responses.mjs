// tests/node/responses.mjs PORT PHASE STATE — the official openai client's
// responses.create against a mnemo server, unmodified (tests/test_responses.c
// runs it). PHASE "first": three turns chained by previous_response_id
// (whole, streamed, whole); the last id goes to the file STATE. PHASE
// "restart": the server was restarted on the same disk tier; retrieve that
// response and continue it (streamed). Prints one JSON line of what it saw;
// exits non-zero on any failed expectation.
import OpenAI from "openai";
import { readFileSync, writeFileSync } from "node:fs";

const [port, phase, state] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "none", maxRetries: 0 });
const base = { model: "stories260K.gguf", instructions: "Tell a story.", temperature: 0, max_output_tokens: 12 };

function check(cond, what) {
  if (!cond) {
    console.error(`expectation failed: ${what}`);
    process.exit(1);
  }
}

async function streamed(params) {
  const stream = await client.responses.create({ ...params, stream: true });
  let text = "", done = null, types = [];
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.completed" || ev.type === "response.incomplete") done = ev.response;
  }
  check(done !== null, "a streamed turn ends with response.completed or response.incomplete");
  check(types[0] === "response.created", "the stream starts with response.created");
  check(done.output_text === undefined || done.output_text === text, "output_text equals the deltas");
  check(done.output[0].content[0].text === text, "the final object holds the streamed text");
  return done;
}

const seen = [];
const textOf = (r) => r.output[0].content[0].text;
function note(r) {
  check(typeof r.id === "string" && r.id.startsWith("resp_"), "a response id");
  check(textOf(r).length > 0, "some text");
  seen.push({ id: r.id, cached: r.usage.input_tokens_details.cached_tokens, input: r.usage.input_tokens });
}

if (phase === "first") {
  const r1 = await client.responses.create({ ...base, input: "Once upon a time" });
  note(r1);
  const r2 = await streamed({ ...base, input: "Tell me more.", previous_response_id: r1.id });
  note(r2);
  const r3 = await client.responses.create({ ...base, input: "And then?", previous_response_id: r2.id });
  note(r3);
  check(r2.usage.input_tokens_details.cached_tokens > 0 && r3.usage.input_tokens_details.cached_tokens > 0,
        "continued turns find their history cached");
  const got = await client.responses.retrieve(r3.id);
  check(r3.output_text === textOf(r3), "the client's output_text is the reply");
  check(got.id === r3.id && textOf(got) === textOf(r3), "retrieve gives the stored response");
  writeFileSync(state, r3.id);
} else {
  const id = readFileSync(state, "utf8");
  const got = await client.responses.retrieve(id);
  check(got.id === id, "the response survived the restart");
  const r4 = await streamed({ ...base, input: "What happened next?", previous_response_id: id });
  note(r4);
  check(r4.usage.input_tokens_details.cached_tokens > 0, "after a restart the history comes from the disk tier");
  let missing = null;
  try {
    await client.responses.create({ ...base, input: "x", previous_response_id: "resp_nope" });
  } catch (e) {
    missing = e;
  }
  check(missing && missing.status === 400, "an unknown previous_response_id is a 400");
}
console.log(JSON.stringify({ phase, seen }));
