// A decision's page: its explanation (the deciding policies in their source with what each
// read, the agent's and the person's parts, the challenge and its outcome, related events),
// "what if", and "save as a test" (docs/portal.md#policy-tests).
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";
import { Link, useParams } from "react-router-dom";
import { gql } from "../api";
import { CedarSource } from "../cedar";
import { graphql } from "../gql";
import type { DecidingPolicyPartsFragment } from "../gql/graphql";
import "../decision.css";
import { Empty, ErrorBox, Guarded, Loading, Principal, Time, Verdict, useAccess, useTitle } from "../ui";

const Explain = graphql(`
  query Explain($qid: String!) {
    explainDecision(qid: $qid) {
      decision {
        qid
        at
        call
        principal { type id }
        onBehalfOf { type id }
        action
        resource { type id }
        verdict
        outcome
        challenges
        policies
        mode
        would
        challengeQid
        workItem
        assigned
        riskScore
        policyVersion
        principalsVersion
        pdp
        onBehalfOfOutcome
      }
      policies { ...DecidingPolicyParts }
      personPolicies { ...DecidingPolicyParts }
      challenge { qid state kinds satisfied approver decidedBy reason justification createdAt expiresAt }
      events { ingestId at system action resource { type id } outcome tool }
    }
  }
`);

graphql(`
  fragment DecidingPolicyParts on DecidingPolicy {
    name file text effect startLine endLine entities
    reads { path read has lines status value source asOf note }
  }
`);

const WhatIf = graphql(`
  query WhatIf($qid: String!, $version: Int) {
    whatIf(qid: $qid, version: $version) { qid recorded version verdict challenges policies error }
  }
`);

const SaveAsTest = graphql(`
  mutation SaveDecisionAsTest($qid: String!, $name: String!) {
    saveDecisionAsTest(qid: $qid, name: $name) {
      test { name expect }
      active { passed got policies error }
    }
  }
`);

export function DecisionPage() {
  const { qid = "" } = useParams();
  useTitle(`Decision ${qid.slice(0, 13)}…`);
  const q = useQuery({ queryKey: ["explain", qid], queryFn: () => gql(Explain, { qid }) });
  if (q.isPending) return <Loading what="the decision" />;
  if (q.isError) return <ErrorBox error={q.error} retry={() => q.refetch()} />;
  const x = q.data.explainDecision;
  if (!x)
    return (
      <>
        <h1>Decision not found</h1>
        <Empty>
          No decision <code>{qid}</code> in the history. It may not be loaded yet (the history reads
          the decision log within seconds); try again shortly.
        </Empty>
      </>
    );
  const d = x.decision;
  // The person's own verdict, challenges and policies (docs/decisions.md#an-agent-acting-for-a-person).
  const personPart = (d.onBehalfOf ? d.onBehalfOfOutcome : null) as {
    verdict?: string;
    challenges?: string[];
    policies?: string[];
  } | null;
  return (
    <>
      <h1>
        Decision <Verdict v={d.verdict} />
      </h1>
      <section aria-labelledby="what-h">
        <h2 id="what-h">What was asked</h2>
        <dl>
          <dt>Decision</dt>
          <dd><code data-volatile="">{d.qid}</code></dd>
          <dt>When</dt>
          <dd><Time at={d.at} /></dd>
          <dt>Principal</dt>
          <dd><Principal p={d.principal} /></dd>
          {d.onBehalfOf && (
            <>
              <dt>On behalf of</dt>
              <dd><Principal p={d.onBehalfOf} /></dd>
            </>
          )}
          <dt>Action</dt>
          <dd>{d.action ?? "—"}</dd>
          <dt>Resource</dt>
          <dd>{d.resource ? `${d.resource.type}::"${d.resource.id}"` : "—"}</dd>
          <dt>Mode</dt>
          <dd>
            {d.mode}
            {d.would && ` (would ${d.would})`}
          </dd>
          <dt>Risk score</dt>
          <dd>{d.riskScore ?? "—"}</dd>
          <dt>Bundle version</dt>
          <dd>{d.policyVersion ?? "—"}</dd>
          <dt>Decision point</dt>
          <dd>{d.pdp ?? "—"}</dd>
        </dl>
      </section>
      <section aria-labelledby="why-h">
        <h2 id="why-h">Why</h2>
        {x.policies.length === 0 && (
          <Empty>
            No policy decided: {d.verdict === "deny" ? "nothing permitted it (deny by default)" : "the verdict came before the policies"}
            {d.policies.length > 0 && <> ({d.policies.join(", ")})</>}.
          </Empty>
        )}
        <DecidingPolicies policies={x.policies} part="agent" />
      </section>
      {d.onBehalfOf && (
        <section aria-labelledby="parts-h">
          <h2 id="parts-h">Agent and person</h2>
          <div className="side">
            <div>
              <h3>Agent</h3>
              <p><Principal p={d.principal} /></p>
              <p><Verdict v={d.verdict} /> {d.policies.join(", ")}</p>
            </div>
            <div>
              <h3>Person</h3>
              <p><Principal p={d.onBehalfOf} /></p>
              <p>
                <Verdict v={personPart?.verdict ?? null} /> {(personPart?.policies ?? []).join(", ")}
                {(personPart?.challenges ?? []).length > 0 && <> (needs {personPart?.challenges?.join(", ")})</>}
              </p>
            </div>
          </div>
          <h3>The person's own check</h3>
          {x.personPolicies.length === 0 ? (
            <Empty>No policy decided the person's check: nothing permitted it, or a built-in verdict came first.</Empty>
          ) : (
            <DecidingPolicies policies={x.personPolicies} part="person" />
          )}
        </section>
      )}
      <section aria-labelledby="ch-h">
        <h2 id="ch-h">Challenge</h2>
        {x.challenge ? (
          <dl>
            <dt>State</dt>
            <dd><span className={`badge ${x.challenge.state.toLowerCase()}`}>{x.challenge.state.toLowerCase()}</span></dd>
            <dt>Kinds</dt>
            <dd>{x.challenge.kinds.join(", ")}</dd>
            <dt>Satisfied</dt>
            <dd>{x.challenge.satisfied.join(", ") || "—"}</dd>
            <dt>Approver</dt>
            <dd>{x.challenge.approver || "—"}</dd>
            <dt>Decided by</dt>
            <dd>{x.challenge.decidedBy || "—"}</dd>
            <dt>Reason</dt>
            <dd>{x.challenge.reason || x.challenge.justification || "—"}</dd>
          </dl>
        ) : (
          <Empty>This decision opened no challenge.</Empty>
        )}
      </section>
      <section aria-labelledby="ev-h">
        <h2 id="ev-h">Related events</h2>
        {x.events.length === 0 ? (
          <Empty>No event carries this decision's id (events arrive from the apps through the intake).</Empty>
        ) : (
          <div className="scroll" tabIndex={0} role="region" aria-label="Related events">
            <table>
              <thead>
                <tr>
                  <th scope="col">When</th>
                  <th scope="col">System</th>
                  <th scope="col">Action</th>
                  <th scope="col">Resource</th>
                  <th scope="col">Outcome</th>
                </tr>
              </thead>
              <tbody>
                {x.events.map((e) => (
                  <tr key={e.ingestId}>
                    <td><Time at={e.at} /></td>
                    <td>{e.system ?? "—"}</td>
                    <td>{e.action}</td>
                    <td>{e.resource ? `${e.resource.type}::"${e.resource.id}"` : "—"}</td>
                    <td>{e.outcome ?? "—"}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </section>
      <WhatIfPanel qid={d.qid} />
      <SaveAsTestPanel
        qid={d.qid}
        verdict={d.verdict ?? ""}
        suggested={`${d.principal?.id ?? ""} ${d.action ?? ""} ${d.resource?.id ?? ""}`.trim().slice(0, 120)}
      />
    </>
  );
}

function WhatIfPanel({ qid }: { qid: string }) {
  const { access } = useAccess();
  const [version, setVersion] = useState("");
  const m = useMutation({
    mutationFn: (v: number | null) => gql(WhatIf, { qid, version: v }),
  });
  const allowed = !!access.policies?.view;
  function submit(e: FormEvent) {
    e.preventDefault();
    m.mutate(version ? Number(version) : null);
  }
  const r = m.data?.whatIf;
  return (
    <section aria-labelledby="wi-h">
      <h2 id="wi-h">What if</h2>
      {!allowed ? (
        <p className="why">Not allowed: deciding again needs <code>view</code> on policies ({access.policies?.viewReason}).</p>
      ) : (
        <form className="inline" onSubmit={submit}>
          <label>
            Bundle version (empty: the active one)
            <input inputMode="numeric" pattern="[0-9]*" value={version} onChange={(e) => setVersion(e.target.value)} />
          </label>
          <button type="submit">Decide again</button>
        </form>
      )}
      {m.isPending && <Loading what="the decision again" />}
      {m.isError && <ErrorBox error={m.error} />}
      {r && (
        <p id="whatif-result">
          Under version {r.version}: <Verdict v={r.verdict} /> (recorded <Verdict v={r.recorded} />)
          {r.policies.length > 0 && <> by {r.policies.join(", ")}</>}
          {r.error && <span className="error-text"> {r.error}</span>}
        </p>
      )}
    </section>
  );
}

/** "Save as a test": the decision's request, a snapshot of its entities and its verdict, kept by
 * the policy service and decided again by every dry run and publish. */
function SaveAsTestPanel({ qid, verdict, suggested }: { qid: string; verdict: string; suggested: string }) {
  const client = useQueryClient();
  const [name, setName] = useState(suggested);
  const m = useMutation({
    mutationFn: () => gql(SaveAsTest, { qid, name: name.trim() }),
    onSuccess: () => client.invalidateQueries({ queryKey: ["policy-tests"] }),
  });
  const saved = m.data?.saveDecisionAsTest;
  return (
    <section aria-labelledby="sat-h">
      <h2 id="sat-h">Save as a test</h2>
      <p className="hint">
        Keeps this request, the directory's records that decide it (as they are now) and its verdict,{" "}
        <Verdict v={verdict} />, as a policy test: every dry run and publish decides it again, and a draft that
        would change it is shown before it ships.
      </p>
      <form
        className="inline"
        onSubmit={(e: FormEvent) => {
          e.preventDefault();
          m.mutate();
        }}
      >
        <label>
          Test name
          <input value={name} onChange={(e) => setName(e.target.value)} maxLength={128} required />
        </label>
        <Guarded area="policies" type="submit" disabled={m.isPending || !name.trim()}>
          Save as a test
        </Guarded>
      </form>
      {m.isError && <ErrorBox error={m.error} />}
      {saved && (
        <p id="saved-test" role="status">
          Saved <strong>{saved.test.name}</strong>, expecting <Verdict v={saved.test.expect} />.{" "}
          {saved.active
            ? saved.active.passed
              ? "It passes under the active bundle."
              : `It fails under the active bundle: got ${saved.active.got}${saved.active.error ? ` (${saved.active.error})` : ""}.`
            : "Nothing is published yet to decide it."}{" "}
          <Link to="/policies#tests-h">See the policy tests</Link>
        </p>
      )}
    </section>
  );
}

type DecidingPolicy = DecidingPolicyPartsFragment;
type Read = DecidingPolicy["reads"][number];

/** The deciding policies of one principal's check, each in its source with what it read. */
function DecidingPolicies({ policies, part }: { policies: readonly DecidingPolicy[]; part: string }) {
  return (
    <>
      {policies.map((p) => {
        return (
          <div key={p.name} className="policy">
            <h3>
              <code>{p.name}</code>
              {p.file && <span className="muted"> in {p.file}</span>}
            </h3>
            {p.text ? (
              <CedarSource
                text={p.text}
                label={`Source of ${p.name}`}
                marked={new Set(p.text.split("\n").map((_, i) => i + 1))}
              />
            ) : (
              <Empty>Not in the active bundle any more (it was changed since).</Empty>
            )}
            {p.text && <PolicyReads p={p} part={part} />}
          </div>
        );
      })}
    </>
  );
}

/** A value as Cedar writes it: an entity `Type::"id"`, a string quoted, the rest as JSON. */
function cedarValue(v: unknown): string {
  const e = (v as { __entity?: { type: string; id: string } } | null)?.__entity;
  if (e) return `${e.type}::${JSON.stringify(e.id)}`;
  return JSON.stringify(v);
}

/** What a read found: the value (or whether it is present, for a `has` alone) and where from. */
function ReadValue({ r }: { r: Read }) {
  if (r.status === "unknown")
    return <span className="unknown">unknown{r.note && <span className="muted"> ({r.note})</span>}</span>;
  const shown =
    r.status === "absent" ? (
      <span className="absent">absent</span>
    ) : r.read ? (
      <code className="val">{cedarValue(r.value)}</code>
    ) : (
      <span className="val">present</span>
    );
  return (
    <>
      {shown}{" "}
      <span className="muted">
        {r.source === "decision" ? (
          <>recorded with the decision</>
        ) : (
          <>
            now, from the {r.source === "bundle" ? "active bundle" : "directory"} (<Time at={r.asOf} />)
          </>
        )}
      </span>
    </>
  );
}

/** Under a deciding policy's source: the attribute paths it read with their values, then the
 * entity literals it names. Lines are the policy's own, as numbered beside its source. */
function PolicyReads({ p, part }: { p: DecidingPolicy; part: string }) {
  const id = `reads-${part}-${p.name.replace(/[^A-Za-z0-9_-]/g, "_")}`;
  const first = p.startLine ?? 1;
  return (
    <div className="reads">
      <h4 id={id}>Read</h4>
      {p.reads.length === 0 ? (
        <p className="muted">It reads no attribute.</p>
      ) : (
        <ul aria-labelledby={id}>
          {p.reads.map((r) => (
            <li key={r.path}>
              <code>{r.path}</code>
              {r.has && !r.read && <span className="muted"> (has)</span>}
              {": "}
              <ReadValue r={r} />
              {r.lines.length > 0 && (
                <span className="muted">
                  {" "}
                  · line {r.lines.map((l) => l - first + 1).join(", ")}
                </span>
              )}
            </li>
          ))}
        </ul>
      )}
      {p.entities.length > 0 && (
        <>
          <h4 id={`${id}-e`}>Entities</h4>
          <ul className="entities" aria-labelledby={`${id}-e`}>
            {p.entities.map((e) => (
              <li key={e}>
                <code>{e}</code>
              </li>
            ))}
          </ul>
        </>
      )}
    </div>
  );
}
