// Challenges: an approver's queue with each request's context; approve or reject with a reason.
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { Link } from "react-router-dom";
import { gql } from "../api";
import { graphql } from "../gql";
import type { ChallengeState } from "../gql/graphql";
import { LiveStatus, QueueLive, pollUnlessLive, useLiveQueries } from "../live";
import { Empty, ErrorBox, Loading, Principal, Time, useAccess, useTitle } from "../ui";

const List = graphql(`
  query Challenges($mine: Boolean!, $state: ChallengeState!) {
    challenges(mine: $mine, state: $state, first: 100) {
      qid
      state
      principal { type id }
      onBehalfOf { type id }
      action
      resource { type id }
      kinds
      satisfied
      person
      approver
      decisionQid
      createdAt
      expiresAt
      decidedBy
      justification
      reason
    }
  }
`);

const Decide = graphql(`
  mutation DecideChallenge($qid: String!, $approve: Boolean!, $reason: String!) {
    decideChallenge(qid: $qid, approve: $approve, reason: $reason) { qid state decidedBy }
  }
`);

const STATES: ChallengeState[] = ["PENDING", "PASSED", "REJECTED", "EXPIRED", "ANY"];

export function ChallengesPage() {
  useTitle("Challenges");
  const { access, user } = useAccess();
  const everyone = !!access.challenges?.view;
  const [mine, setMine] = useState(!everyone);
  const [state, setState] = useState<ChallengeState>("PENDING");
  const client = useQueryClient();
  // The queue follows the challenges as they open and change (docs/portal.md#live-updates);
  // while the socket is down it asks again every 5 s.
  const live = useLiveQueries(QueueLive, { mine }, [["challenges"], ["ov-challenges"]], everyone || !!access.challenges?.own);
  const q = useQuery({
    queryKey: ["challenges", mine, state],
    queryFn: () => gql(List, { mine, state }),
    refetchInterval: pollUnlessLive(live),
  });
  const [reasons, setReasons] = useState<Record<string, string>>({});
  const m = useMutation({
    mutationFn: (v: { qid: string; approve: boolean }) =>
      gql(Decide, { qid: v.qid, approve: v.approve, reason: reasons[v.qid] ?? "" }),
    onSuccess: () => client.invalidateQueries({ queryKey: ["challenges"] }),
  });
  return (
    <>
      <div className="page-head">
        <h1>Challenges</h1>
        <LiveStatus state={live} />
      </div>
      <section aria-labelledby="f-h">
        <h2 id="f-h">Show</h2>
        <form className="inline" onSubmit={(e) => e.preventDefault()}>
          <label>
            State
            <select value={state} onChange={(e) => setState(e.target.value as ChallengeState)}>
              {STATES.map((s) => (
                <option key={s} value={s}>
                  {s.toLowerCase()}
                </option>
              ))}
            </select>
          </label>
          <label className="check">
            <input type="checkbox" checked={mine} disabled={!everyone} onChange={(e) => setMine(e.target.checked)} />
            Only mine (I answer or approve)
          </label>
          {!everyone && <span className="why">Everyone's challenges need <code>view</code> on challenges.</span>}
        </form>
      </section>
      <section aria-labelledby="q-h" aria-busy={q.isFetching}>
        <h2 id="q-h">Queue</h2>
        {q.isPending && <Loading what="challenges" />}
        {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
        {q.data && q.data.challenges.length === 0 && <Empty>No {state.toLowerCase()} challenge.</Empty>}
        {m.isError && <ErrorBox error={m.error} />}
        <ul className="cards">
          {q.data?.challenges.map((c) => {
            const approver = c.approver === user;
            const pending = c.state === "PENDING";
            return (
              <li key={c.qid} className="card" data-qid={c.qid}>
                <h3>
                  <Principal p={c.principal} /> wants to <strong>{c.action}</strong>{" "}
                  {c.resource ? `${c.resource.type}::"${c.resource.id}"` : ""}
                </h3>
                <dl>
                  <dt>State</dt>
                  <dd><span className={`badge ${c.state.toLowerCase()}`}>{c.state.toLowerCase()}</span></dd>
                  {c.onBehalfOf && (
                    <>
                      <dt>For</dt>
                      <dd><Principal p={c.onBehalfOf} /></dd>
                    </>
                  )}
                  <dt>Asks for</dt>
                  <dd>{c.kinds.join(", ")}</dd>
                  <dt>Approver</dt>
                  <dd>{c.approver || "—"}</dd>
                  <dt>Opened</dt>
                  <dd><Time at={c.createdAt} /></dd>
                  <dt>Expires</dt>
                  <dd><Time at={c.expiresAt} /></dd>
                  {c.justification && (
                    <>
                      <dt>Justification</dt>
                      <dd>{c.justification}</dd>
                    </>
                  )}
                  {c.decidedBy && (
                    <>
                      <dt>Decided by</dt>
                      <dd>{c.decidedBy}{c.reason && `: ${c.reason}`}</dd>
                    </>
                  )}
                  <dt>Decision</dt>
                  <dd>
                    {access.decisions?.view ? <Link to={`/decisions/${c.decisionQid}`}>Explain</Link> : <code data-volatile="">{c.decisionQid}</code>}
                  </dd>
                </dl>
                {pending && c.kinds.includes("approval") && (
                  approver ? (
                    <div className="inline">
                      <label>
                        Reason
                        <input
                          value={reasons[c.qid] ?? ""}
                          onChange={(e) => setReasons({ ...reasons, [c.qid]: e.target.value })}
                        />
                      </label>
                      <button type="button" className="primary" disabled={m.isPending} onClick={() => m.mutate({ qid: c.qid, approve: true })}>
                        Approve
                      </button>
                      <button type="button" className="danger" disabled={m.isPending} onClick={() => m.mutate({ qid: c.qid, approve: false })}>
                        Reject
                      </button>
                    </div>
                  ) : (
                    <p className="why">Only its approver ({c.approver || "none named"}) decides this challenge.</p>
                  )
                )}
              </li>
            );
          })}
        </ul>
      </section>
    </>
  );
}
