// A JavaScript worker reads every answer with JSON.parse, which reads
// numbers as doubles: a lease id must come back exact, or the release that
// follows frees nothing and the place stays held until the lease expires.
// .ci/clients runs this with node --test against a live replica (QA_BASE,
// QA_TOKEN).
import { test } from "node:test";
import assert from "node:assert/strict";

const base = process.env.QA_BASE;
const token = process.env.QA_TOKEN;

async function call(method, path, body, headers = {}) {
  const response = await fetch(base + path, {
    method,
    headers: { "content-type": "application/json", ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  assert.ok(response.ok, `${method} ${path}: ${response.status} ${text}`);
  return JSON.parse(text);
}

const admin = { authorization: `Bearer ${token}` };

test("a lease read by JSON.parse is released", async () => {
  await call("PUT", "/v1/quotas/js-places", { hourly_ceiling: 1000, max_in_flight: 1 }, admin);
  await call("PUT", "/v1/flows/js-emit", { quota: "js-places", mode: "enforce" }, admin);
  for (let round = 0; round < 3; round++) {
    const granted = await call("POST", "/v1/reserve", { flow: "js-emit" });
    assert.equal(granted.outcome, "granted");
    assert.equal(typeof granted.lease_id, "string");
    const held = await call("POST", "/v1/reserve", { flow: "js-emit" });
    assert.equal(held.outcome, "deferred");
    assert.equal(held.limit, "in_flight");
    const freed = await call("POST", "/v1/report", { flow: "js-emit", lease_id: granted.lease_id });
    assert.equal(freed.released, true, `round ${round}: ${JSON.stringify(freed)}`);
  }
});
