// A principal's page: profile and groups, risk score with its factors and its 30-day history,
// recent decisions, and containment (contain or lift, with a reason).
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";
import { Link, useParams } from "react-router-dom";
import { gql } from "../api";
import { DailyScores } from "../chart";
import { graphql } from "../gql";
import { Empty, ErrorBox, Guarded, Loading, Time, Verdict, useAccess, useTitle } from "../ui";

const People = graphql(`
  query People {
    people(includeRemoved: true) { userName displayName active removed department title manager groups }
  }
`);
const Accounts = graphql(`
  query ServiceAccounts {
    serviceAccounts { id owner ai groups description app }
  }
`);
const Risks = graphql(`
  query Risks {
    riskScores(minScore: 0, first: 200) { principal { type id } score reason factors updatedAt }
  }
`);
const Recent = graphql(`
  query RecentDecisions($principal: EntityRefInput!, $since: DateTime!) {
    decisions(principal: $principal, since: $since, first: 20) {
      decisions { qid at action resource { type id } verdict policies }
      hasNextPage
    }
  }
`);
const OwnChallenges = graphql(`
  query PrincipalChallenges($principal: EntityRefInput!) {
    challenges(mine: false, principal: $principal, first: 20) {
      qid state action resource { type id } kinds approver decidedBy reason decisionQid createdAt
    }
  }
`);
const Containments = graphql(`
  query Containments {
    containments { principal { type id } reason author containedAt }
  }
`);
const Contain = graphql(`
  mutation Contain($principal: EntityRefInput!, $reason: String!) {
    contain(principal: $principal, reason: $reason) { changed containment { reason } }
  }
`);
const Lift = graphql(`
  mutation Lift($principal: EntityRefInput!, $reason: String!) {
    lift(principal: $principal, reason: $reason)
  }
`);

const Reach = graphql(`
  query Reachable($principal: EntityRefInput!, $action: String!, $resourceType: String!) {
    reachable(principal: $principal, action: $action, resourceType: $resourceType, first: 50) {
      results { type id }
      nextToken
      decisionQid
    }
  }
`);
const Keys = graphql(`
  query SecurityKeys($person: String) {
    securityKeys(person: $person) { credentialId name signCount createdAt lastUsedAt }
  }
`);

export function PrincipalPage() {
  const { type = "", id = "" } = useParams();
  useTitle(`${type} ${id}`);
  const { access } = useAccess();
  const principal = { type, id };
  return (
    <>
      <h1>
        {type}::"{id}"
      </h1>
      {access.directory?.view ? <Profile type={type} id={id} /> : <Refused area="directory" />}
      {access.directory?.view && <Risk type={type} id={id} />}
      {access.containments?.view ? <Containment principal={principal} /> : <Refused area="containments" />}
      {access.challenges?.view ? <PrincipalChallenges principal={principal} /> : <Refused area="challenges" />}
      {access.directory?.view && <Agents type={type} id={id} />}
      {type === "Human" && access.keys?.view && <SecurityKeysPanel person={id} />}
      {access.policies?.view ? <Reachable principal={principal} /> : <Refused area="policies" />}
      {access.decisions?.view ? <RecentDecisions principal={principal} /> : <Refused area="decisions" />}
    </>
  );
}

function Refused({ area }: { area: string }) {
  const { access } = useAccess();
  return (
    <section>
      <h2>{area[0].toUpperCase() + area.slice(1)}</h2>
      <p className="why">Not shown: {access[area]?.viewReason ?? "no access"}</p>
    </section>
  );
}

function Profile({ type, id }: { type: string; id: string }) {
  const human = type === "Human";
  const people = useQuery({ queryKey: ["people"], queryFn: () => gql(People), enabled: human });
  const accounts = useQuery({ queryKey: ["accounts"], queryFn: () => gql(Accounts), enabled: !human });
  const q = human ? people : accounts;
  return (
    <section aria-labelledby="profile-h">
      <h2 id="profile-h">Profile</h2>
      {q.isPending && <Loading what="the profile" />}
      {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
      {human &&
        people.data &&
        (() => {
          const p = people.data.people.find((x) => x.userName === id);
          if (!p) return <Empty>Not in the directory (never provisioned, or its record was purged).</Empty>;
          return (
            <dl>
              <dt>Name</dt>
              <dd>{p.displayName ?? p.userName}</dd>
              <dt>Title</dt>
              <dd>{p.title ?? "—"}</dd>
              <dt>Department</dt>
              <dd>{p.department ?? "—"}</dd>
              <dt>Manager</dt>
              <dd>{p.manager ? <Link to={`/principals/Human/${encodeURIComponent(p.manager)}`}>{p.manager}</Link> : "—"}</dd>
              <dt>State</dt>
              <dd>{p.removed ? "removed" : p.active ? "active" : "inactive"}</dd>
              <dt>Groups</dt>
              <dd>{p.groups.length ? p.groups.join(", ") : "none"}</dd>
            </dl>
          );
        })()}
      {!human &&
        accounts.data &&
        (() => {
          const a = accounts.data.serviceAccounts.find((x) => x.id === id);
          if (!a) return <Empty>Not a registered service account (an unregistered one is denied everything).</Empty>;
          return (
            <dl>
              <dt>Owner</dt>
              <dd><Link to={`/principals/Human/${encodeURIComponent(a.owner)}`}>{a.owner}</Link></dd>
              <dt>App</dt>
              <dd>{a.app || "—"}</dd>
              <dt>AI</dt>
              <dd>{a.ai ? "yes" : "no"}</dd>
              <dt>Groups</dt>
              <dd>{a.groups.join(", ") || "none"}</dd>
              <dt>Description</dt>
              <dd>{a.description || "—"}</dd>
            </dl>
          );
        })()}
    </section>
  );
}

const History = graphql(`
  query RiskHistory($principal: EntityRefInput!) {
    riskHistory(principal: $principal, days: 30) { day score high published }
  }
`);

/** The thresholds the shipped policies apply to `context.risk_score` (docs/reasoner.md). */
const RISK_LINES = [
  { at: 70, label: "step-up" },
  { at: 90, label: "deny" },
];

type Factor = { name?: string; family?: string; observed?: number; baseline?: number; peers?: number; contribution?: number; day?: string };

function num(v: unknown): string {
  return typeof v === "number" ? v.toLocaleString(undefined, { maximumFractionDigits: 1 }) : "—";
}

function Risk({ type, id }: { type: string; id: string }) {
  const q = useQuery({ queryKey: ["risks"], queryFn: () => gql(Risks) });
  const h = useQuery({ queryKey: ["risk-history", type, id], queryFn: () => gql(History, { principal: { type, id } }) });
  const r = q.data?.riskScores.find((x) => x.principal.type === type && x.principal.id === id);
  const factors: Factor[] = r && Array.isArray(r.factors) ? (r.factors as Factor[]) : [];
  const days = h.data?.riskHistory ?? [];
  return (
    <section aria-labelledby="risk-h">
      <h2 id="risk-h">Risk</h2>
      {q.isPending && <Loading what="the risk score" />}
      {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
      {q.data && !r && <Empty>No score: the reasoner has not scored this principal.</Empty>}
      {r && (
        <>
          <p>
            <span className="score" aria-label={`Risk score ${r.score} of 100`}>{r.score}</span> / 100 — {r.reason}
            {r.updatedAt && (
              <>
                {" "}
                <span style={{ whiteSpace: "nowrap" }}>
                  (scored <Time at={r.updatedAt} />)
                </span>
              </>
            )}
          </p>
          {factors.length > 0 && (
            <div className="scroll" tabIndex={0} role="region" aria-label="Risk factors">
              <table>
                <caption>Factors, largest first</caption>
                <thead>
                  <tr>
                    <th scope="col">Factor</th>
                    <th scope="col">Points</th>
                    <th scope="col">Observed</th>
                    <th scope="col">Own usual</th>
                    <th scope="col">Peers' usual</th>
                    <th scope="col">Day</th>
                  </tr>
                </thead>
                <tbody>
                  {factors.map((f, i) => (
                    <tr key={`${f.name}-${i}`}>
                      <th scope="row">
                        {f.name ?? "—"}
                        {f.family && <span className="muted"> ({f.family})</span>}
                      </th>
                      <td>{num(f.contribution)}</td>
                      <td>{num(f.observed)}</td>
                      <td>{num(f.baseline)}</td>
                      <td>{num(f.peers)}</td>
                      <td>{f.day ?? "—"}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
        </>
      )}
      <h3 id="risk-history-h">The last 30 days</h3>
      {h.isPending && <Loading what="the risk history" />}
      {h.isError && <ErrorBox error={h.error} retry={() => h.refetch()} />}
      {h.data && !days.some((d) => d.high != null) && <Empty>No score in the last 30 days.</Empty>}
      {h.data && days.some((d) => d.high != null) && (
        <div id="risk-history">
          <DailyScores title="Risk score per day, last 30 days" days={days} lines={RISK_LINES} />
          <p className="hint">
            The lines are where the shipped policies step a check up (70) and deny it (90); a day without a new score kept
            the day before's.
          </p>
        </div>
      )}
    </section>
  );
}

function Containment({ principal }: { principal: { type: string; id: string } }) {
  const client = useQueryClient();
  const q = useQuery({ queryKey: ["containments"], queryFn: () => gql(Containments) });
  const [reason, setReason] = useState("");
  const [confirming, setConfirming] = useState(false);
  const c = q.data?.containments.find((x) => x.principal.type === principal.type && x.principal.id === principal.id);
  const m = useMutation({
    mutationFn: async (contain: boolean) =>
      contain ? gql(Contain, { principal, reason }) : gql(Lift, { principal, reason }),
    onSuccess: async () => {
      setReason("");
      setConfirming(false);
      await client.invalidateQueries({ queryKey: ["containments"] });
    },
  });
  function submit(e: FormEvent) {
    e.preventDefault();
    if (!confirming) {
      setConfirming(true);
      return;
    }
    m.mutate(!c);
  }
  return (
    <section aria-labelledby="cont-h">
      <h2 id="cont-h">Containment</h2>
      {q.isPending && <Loading what="containments" />}
      {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
      {q.data && (
        <>
          <p id="containment-state">
            {c ? (
              <>
                <strong className="badge deny">contained</strong> by {c.author} (<Time at={c.containedAt} />): {c.reason}. Every
                decision point denies it everything.
              </>
            ) : (
              <>Not contained.</>
            )}
          </p>
          <form className="inline" onSubmit={submit}>
            <label>
              Reason
              <input value={reason} onChange={(e) => setReason(e.target.value)} required={!c} maxLength={500} />
            </label>
            <Guarded area="containments" type="submit" className={c ? "" : "danger"} disabled={m.isPending}>
              {confirming ? (c ? "Confirm: lift" : "Confirm: contain") : c ? "Lift containment" : "Contain"}
            </Guarded>
            {confirming && (
              <button type="button" onClick={() => setConfirming(false)}>
                Cancel
              </button>
            )}
          </form>
          {m.isError && <ErrorBox error={m.error} />}
        </>
      )}
    </section>
  );
}

function RecentDecisions({ principal }: { principal: { type: string; id: string } }) {
  const [since] = useState(() => new Date(Date.now() - 86_400_000).toISOString());
  const q = useQuery({
    queryKey: ["recent", principal, since],
    queryFn: () => gql(Recent, { principal, since }),
  });
  const search = `/decisions?subject=principal&type=${encodeURIComponent(principal.type)}&id=${encodeURIComponent(principal.id)}`;
  return (
    <section aria-labelledby="rec-h">
      <h2 id="rec-h">Decisions of the last day</h2>
      {q.isPending && <Loading what="decisions" />}
      {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
      {q.data && q.data.decisions.decisions.length === 0 && <Empty>No decision in the last day.</Empty>}
      {q.data && q.data.decisions.decisions.length > 0 && (
        <div className="scroll" tabIndex={0} role="region" aria-label="Decisions of the last day">
          <table>
            <thead>
              <tr>
                <th scope="col">When</th>
                <th scope="col">Action</th>
                <th scope="col">Resource</th>
                <th scope="col">Verdict</th>
                <th scope="col">Decision</th>
              </tr>
            </thead>
            <tbody>
              {q.data.decisions.decisions.map((d) => (
                <tr key={d.qid}>
                  <td><Time at={d.at} /></td>
                  <td>{d.action}</td>
                  <td>{d.resource ? `${d.resource.type}::"${d.resource.id}"` : "—"}</td>
                  <td><Verdict v={d.verdict} /></td>
                  <td><Link to={`/decisions/${d.qid}`}>Explain</Link></td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      <p>
        <Link to={search}>Search all of its decisions</Link>
      </p>
    </section>
  );
}

/** The principal's recent challenges and what became of them (newest first). */
function PrincipalChallenges({ principal }: { principal: { type: string; id: string } }) {
  const q = useQuery({ queryKey: ["principal-challenges", principal], queryFn: () => gql(OwnChallenges, { principal }) });
  return (
    <section aria-labelledby="pch-h">
      <h2 id="pch-h">Challenges</h2>
      {q.isPending && <Loading what="challenges" />}
      {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
      {q.data && q.data.challenges.length === 0 && <Empty>No challenge for this principal.</Empty>}
      {q.data && q.data.challenges.length > 0 && (
        <div className="scroll" tabIndex={0} role="region" aria-label="The principal's challenges">
          <table>
            <thead>
              <tr>
                <th scope="col">When</th>
                <th scope="col">Request</th>
                <th scope="col">Asked for</th>
                <th scope="col">Outcome</th>
                <th scope="col">Decision</th>
              </tr>
            </thead>
            <tbody>
              {q.data.challenges.map((c) => (
                <tr key={c.qid}>
                  <td><Time at={c.createdAt} /></td>
                  <td className="wrap">
                    {c.action} {c.resource ? `${c.resource.type}::"${c.resource.id}"` : "—"}
                  </td>
                  <td>{c.kinds.join(", ") || "—"}{c.approver ? ` (approver ${c.approver})` : ""}</td>
                  <td>
                    <span className={`badge ${c.state.toLowerCase()}`}>{c.state.toLowerCase()}</span>
                    {c.decidedBy && <span className="muted"> by {c.decidedBy}</span>}
                    {c.reason && <span className="muted">: {c.reason}</span>}
                  </td>
                  <td>{c.decisionQid ? <Link to={`/decisions/${c.decisionQid}`}>Explain</Link> : "—"}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}

/** The agents acting for a person (service accounts it owns), or the person an agent acts for. */
function Agents({ type, id }: { type: string; id: string }) {
  const q = useQuery({ queryKey: ["accounts"], queryFn: () => gql(Accounts) });
  if (type !== "Human") return null;
  const mine = q.data?.serviceAccounts.filter((a) => a.owner === id) ?? [];
  return (
    <section aria-labelledby="agents-h">
      <h2 id="agents-h">Agents acting for this person</h2>
      {q.isPending && <Loading what="agents" />}
      {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
      {q.data && mine.length === 0 && <Empty>No registered agent or service account names this person as its owner.</Empty>}
      {mine.length > 0 && (
        <ul className="plain">
          {mine.map((a) => (
            <li key={a.id}>
              <Link to={`/principals/ServiceAccount/${encodeURIComponent(a.id)}`}>{a.id}</Link>{" "}
              <span className="muted">
                {a.ai ? "AI agent" : "service account"}
                {a.app && ` of ${a.app}`}
              </span>
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}

function SecurityKeysPanel({ person }: { person: string }) {
  const q = useQuery({ queryKey: ["keys", person], queryFn: () => gql(Keys, { person }) });
  return (
    <section aria-labelledby="keys-h">
      <h2 id="keys-h">Security keys</h2>
      {q.isPending && <Loading what="security keys" />}
      {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
      {q.data && q.data.securityKeys.length === 0 && <Empty>No security key registered (verification challenges need one).</Empty>}
      {q.data && q.data.securityKeys.length > 0 && (
        <ul className="plain">
          {q.data.securityKeys.map((k) => (
            <li key={k.credentialId}>
              {k.name || "a key"} <span className="muted">(registered <Time at={k.createdAt} />, last used <Time at={k.lastUsedAt} />)</span>
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}

/** "What can this principal reach": the decision point's resource search for an action. */
function Reachable({ principal }: { principal: { type: string; id: string } }) {
  const [action, setAction] = useState("read");
  const [resourceType, setResourceType] = useState("Document");
  const m = useMutation({ mutationFn: () => gql(Reach, { principal, action, resourceType }) });
  return (
    <section aria-labelledby="reach-h">
      <h2 id="reach-h">What it can reach</h2>
      <form
        className="inline"
        onSubmit={(e: FormEvent) => {
          e.preventDefault();
          m.mutate();
        }}
      >
        <label>
          Action
          <input value={action} onChange={(e) => setAction(e.target.value)} required />
        </label>
        <label>
          Resource type
          <input value={resourceType} onChange={(e) => setResourceType(e.target.value)} required />
        </label>
        <button type="submit" disabled={m.isPending}>
          Search
        </button>
      </form>
      {m.isPending && <Loading what="what it can reach" />}
      {m.isError && <ErrorBox error={m.error} />}
      {m.data && m.data.reachable.results.length === 0 && <Empty>Nothing of that type: every such resource is denied.</Empty>}
      {m.data && m.data.reachable.results.length > 0 && (
        <p id="reachable">
          {m.data.reachable.results.map((r) => `${r.type}::"${r.id}"`).join(", ")}
          {m.data.reachable.nextToken && " and more"}
        </p>
      )}
    </section>
  );
}
