// Overview: what needs attention now: decisions per hour by verdict over the last day and
// week (and what monitor mode would have denied or challenged), the most denied principals and
// resources, intake and decision rates, pending challenges, active containments, the highest
// risks, the enforcement mode and the active bundle. Each card needs `view` on its area.
import { useQuery } from "@tanstack/react-query";
import { useState } from "react";
import { Link } from "react-router-dom";
import { gql } from "../api";
import { type Series, StackedBars, everyHour } from "../chart";
import { graphql } from "../gql";
import { ContainmentsLive, LiveStatus, QueueLive, pollUnlessLive, useLiveQueries } from "../live";
import { Empty, ErrorBox, Loading, Principal, Time, useAccess, useTitle } from "../ui";

const Stats = graphql(`
  query OverviewStats($since: DateTime!, $until: DateTime!) {
    decisionStats(since: $since, until: $until, bucket: HOUR, top: 5) {
      buckets { at allow deny challenge wouldDeny wouldChallenge plans events }
      topDeniedPrincipals { entity { type id } count }
      topDeniedResources { entity { type id } count }
    }
  }
`);
const VERDICTS: Series[] = [
  { key: "allow", label: "Allowed", color: "#1a7f37" },
  { key: "deny", label: "Denied", color: "#cf222e" },
  { key: "challenge", label: "Challenged", color: "#9a6700" },
];
const WOULD: Series[] = [
  { key: "wouldDeny", label: "Would deny", color: "#a40e26" },
  { key: "wouldChallenge", label: "Would challenge", color: "#6e4b00" },
];
const KEYS = ["allow", "deny", "challenge", "wouldDeny", "wouldChallenge", "plans", "events"];
const HOUR_MS = 3_600_000;

function Activity({ monitor }: { monitor: boolean }) {
  // The range ends at the next full hour, fixed for the page's life so the cache holds.
  const [until] = useState(() => new Date(Math.ceil(Date.now() / HOUR_MS) * HOUR_MS));
  const week = new Date(until.getTime() - 7 * 24 * HOUR_MS);
  const stats = useQuery({
    queryKey: ["ov-stats", until.toISOString()],
    queryFn: () => gql(Stats, { since: week.toISOString(), until: until.toISOString() }),
  });
  if (stats.isPending) return <Loading what="the decision history" />;
  if (stats.isError) return <ErrorBox error={stats.error} retry={() => stats.refetch()} />;
  const s = stats.data.decisionStats;
  const weekly = everyHour(s.buckets, week, until, KEYS);
  const daily = weekly.slice(-24);
  const sum = (rows: typeof weekly, k: string) => rows.reduce((n, b) => n + Number(b[k]), 0);
  const decided = (rows: typeof weekly) => sum(rows, "allow") + sum(rows, "deny") + sum(rows, "challenge") + sum(rows, "plans");
  const lastHour = weekly.filter((b) => new Date(b.at).getTime() + HOUR_MS <= Date.now()).slice(-1);
  const would = sum(weekly, "wouldDeny") + sum(weekly, "wouldChallenge");
  if (decided(weekly) === 0 && sum(weekly, "events") === 0) {
    return <Empty>No decisions or events in the last 7 days.</Empty>;
  }
  return (
    <>
      <div className="counts">
        <div>
          <strong data-volatile="">{decided(lastHour).toLocaleString()}</strong> decisions in the last full hour
        </div>
        <div>
          <strong data-volatile="">{Math.round(decided(daily) / 24).toLocaleString()}</strong> decisions per hour, last 24 h
        </div>
        <div>
          <strong data-volatile="">{sum(lastHour, "events").toLocaleString()}</strong> events taken in, last full hour
        </div>
        <div>
          <strong data-volatile="">{Math.round(sum(daily, "events") / 24).toLocaleString()}</strong> events per hour, last 24 h
        </div>
      </div>
      <StackedBars title="Decisions per hour, last 24 hours" buckets={daily} series={VERDICTS} />
      <StackedBars title="Decisions per hour, last 7 days" buckets={weekly} series={VERDICTS} />
      {(monitor || would > 0) && (
        <StackedBars title="In monitor mode, per hour, last 7 days" buckets={weekly} series={WOULD} />
      )}
      <div className="side">
        <Ranked title="Most denied principals, last 7 days" rows={s.topDeniedPrincipals} link />
        <Ranked title="Most denied resources, last 7 days" rows={s.topDeniedResources} />
      </div>
    </>
  );
}

function Ranked({
  title,
  rows,
  link,
}: {
  title: string;
  rows: { entity: { type: string; id: string }; count: number }[];
  link?: boolean;
}) {
  return (
    <div>
      <h3>{title}</h3>
      {rows.length === 0 ? (
        <Empty>No denials.</Empty>
      ) : (
        <ol className="ranked">
          {rows.map((r) => (
            <li key={`${r.entity.type}/${r.entity.id}`}>
              {link ? <Principal p={r.entity} /> : <code>{`${r.entity.type}::"${r.entity.id}"`}</code>}{" "}
              <span className="muted" data-volatile="">{r.count.toLocaleString()} denied</span>
            </li>
          ))}
        </ol>
      )}
    </div>
  );
}

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
  // Pending challenges and containments follow their subscriptions (docs/portal.md#live-updates).
  const challengesLive = useLiveQueries(QueueLive, { mine: !everyone }, [["ov-challenges"]], everyone || !!access.challenges?.own);
  const containmentsLive = useLiveQueries(ContainmentsLive, {}, [["containments-ov"]], !!access.containments?.view);
  const pending = useQuery({
    queryKey: ["ov-challenges", everyone],
    queryFn: () => gql(Pending, { mine: !everyone }),
    enabled: everyone || !!access.challenges?.own,
    refetchInterval: pollUnlessLive(challengesLive),
  });
  const contained = useQuery({
    queryKey: ["containments-ov"],
    queryFn: () => gql(Contained),
    enabled: !!access.containments?.view,
    refetchInterval: pollUnlessLive(containmentsLive),
  });
  const follows = [challengesLive, containmentsLive].filter((s) => s !== "off");
  const live = follows.find((s) => s !== "live") ?? follows[0];
  const risks = useQuery({ queryKey: ["ov-risks"], queryFn: () => gql(TopRisks), enabled: !!access.directory?.view });
  const state = useQuery({
    queryKey: ["ov-state"],
    queryFn: () => gql(State),
    enabled: !!access.enforcement?.view && !!access.policies?.view,
  });
  return (
    <>
      <div className="page-head">
        <h1>Overview</h1>
        {live && <LiveStatus state={live} />}
      </div>
      <Card title="Decisions and intake" area="decisions">
        <Activity monitor={state.data?.enforcement.mode === "MONITOR"} />
        <p><Link to="/decisions">Search the decisions</Link></p>
      </Card>
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
