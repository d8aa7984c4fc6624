// Compiled with tsc --noEmit --strict against the types openapi-typescript
// generates (.ci/clients): what a TypeScript worker writes must type-check.
import type { components, paths } from "./out/schema";

type Decision = components["schemas"]["Decision"];
type Report = components["schemas"]["FeedbackBody"];
type Enqueue = paths["/v1/work"]["post"]["requestBody"]["content"]["application/json"];

export function releaseOf(decision: Decision): Report | undefined {
  // A lease id is a string: exact in every JSON reader.
  const lease: string | null | undefined = decision.lease_id;
  return lease ? { flow: decision.flow, lease_id: lease } : undefined;
}

// A ref alone is enough to enqueue: the payload is optional.
export const job: Enqueue = { flow: "invoice", ref: "inv-42" };
