// Overview: what needs attention now: pending challenges, active containments, the highest
// risks, the enforcement mode and the active bundle. Each card needs `view` on its area.
import { useQuery } from "@tanstack/react-query";
import { Link } from "react-router-dom";
import { gql } from "../api";
import { graphql } from "../gql";
import { Empty, ErrorBox, Loading, Principal, Time, useAccess, useTitle } from "../ui";

const Pending = graphql(`
  query OverviewChallenges($mine: Boolean!) {
    challenges(mine: $mine, state: PENDING, first: 10) { qid principal { type id } action resource { type id } approver createdAt }
  }
`);
const Contained = graphql(`
  query OverviewContainments {
    containments { principal { type id } reason author containedAt }
  }
`);
const TopRisks = graphql(`
  query OverviewRisks {
    riskScores(minScore: 0, first: 8) { principal { type id } score reason }
  }
`);
const State = graphql(`
  query OverviewState {
    enforcement { mode containmentMode }
    bundle { version author publishedAt policies }
  }
`);

function Card({ title, children, area }: { title: string; children: React.ReactNode; area: string }) {
  const { access } = useAccess();
  return (
    <section aria-label={title}>
      <h2>{title}</h2>
      {access[area]?.view || (area === "challenges" && access.challenges?.own) ? (
        children
      ) : (
        <p className="why">Not shown: {access[area]?.viewReason}</p>
      )}
    </section>
  );
}

export function OverviewPage() {
  useTitle("Overview");
  const { access } = useAccess();
  const everyone = !!access.challenges?.view;
  const pending = useQuery({
    queryKey: ["ov-challenges", everyone],
    queryFn: () => gql(Pending, { mine: !everyone }),
    enabled: everyone || !!access.challenges?.own,
  });
  const contained = useQuery({ queryKey: ["containments-ov"], queryFn: () => gql(Contained), enabled: !!access.containments?.view });
  const risks = useQuery({ queryKey: ["ov-risks"], queryFn: () => gql(TopRisks), enabled: !!access.directory?.view });
  const state = useQuery({
    queryKey: ["ov-state"],
    queryFn: () => gql(State),
    enabled: !!access.enforcement?.view && !!access.policies?.view,
  });
  return (
    <>
      <h1>Overview</h1>
      <div className="grid">
        <Card title="Pending challenges" area="challenges">
          {pending.isPending && <Loading what="challenges" />}
          {pending.isError && <ErrorBox error={pending.error} retry={() => pending.refetch()} />}
          {pending.data && pending.data.challenges.length === 0 && <Empty>Nothing waits for an answer.</Empty>}
          {pending.data && pending.data.challenges.length > 0 && (
            <ul className="plain">
              {pending.data.challenges.map((c) => (
                <li key={c.qid}>
                  <Principal p={c.principal} /> → {c.action} {c.resource?.id} <span className="muted">(approver {c.approver || "—"})</span>
                </li>
              ))}
            </ul>
          )}
          <p><Link to="/challenges">The queue</Link></p>
        </Card>
        <Card title="Active containments" area="containments">
          {contained.isPending && <Loading what="containments" />}
          {contained.isError && <ErrorBox error={contained.error} retry={() => contained.refetch()} />}
          {contained.data && contained.data.containments.length === 0 && <Empty>Nobody is contained.</Empty>}
          {contained.data && contained.data.containments.length > 0 && (
            <ul className="plain">
              {contained.data.containments.map((c) => (
                <li key={`${c.principal.type}/${c.principal.id}`}>
                  <Principal p={c.principal} />: {c.reason} <span className="muted">({c.author}, <Time at={c.containedAt} />)</span>
                </li>
              ))}
            </ul>
          )}
          <p><Link to="/containments">All containments</Link></p>
        </Card>
        <Card title="Highest risks" area="directory">
          {risks.isPending && <Loading what="risk scores" />}
          {risks.isError && <ErrorBox error={risks.error} retry={() => risks.refetch()} />}
          {risks.data && risks.data.riskScores.length === 0 && <Empty>No scores yet: the reasoner has not scored anyone.</Empty>}
          {risks.data && risks.data.riskScores.length > 0 && (
            <ul className="plain">
              {risks.data.riskScores.map((r) => (
                <li key={`${r.principal.type}/${r.principal.id}`}>
                  <strong>{r.score}</strong> <Principal p={r.principal} /> <span className="muted">{r.reason}</span>
                </li>
              ))}
            </ul>
          )}
        </Card>
        <Card title="Enforcement and policies" area="enforcement">
          {state.isPending && <Loading what="the modes" />}
          {state.isError && <ErrorBox error={state.error} retry={() => state.refetch()} />}
          {state.data && (
            <dl>
              <dt>Install mode</dt>
              <dd>{state.data.enforcement.mode.toLowerCase()}</dd>
              <dt>Automated containments</dt>
              <dd>{state.data.enforcement.containmentMode.toLowerCase()}</dd>
              <dt>Active bundle</dt>
              <dd>
                {state.data.bundle ? (
                  <Link to={`/policies/${state.data.bundle.version}`}>
                    v{state.data.bundle.version} ({state.data.bundle.policies.length} policies, by {state.data.bundle.author})
                  </Link>
                ) : (
                  "none published"
                )}
              </dd>
            </dl>
          )}
        </Card>
      </div>
    </>
  );
}
