// Policies: the enforcement modes, bundle versions (publish, roll back), a bundle's files, its
// diff against the active bundle and a dry run's impact, and the draft editor with the
// validation problems inline at their line and column.
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useEffect, useState, type FormEvent } from "react";
import { Link, useNavigate, useParams } from "react-router-dom";
import { gql } from "../api";
import { CedarEditor, CedarSource, type Note } from "../cedar";
import "../policies.css";
import { graphql } from "../gql";
import type { Mode } from "../gql/graphql";
import { Empty, ErrorBox, Guarded, Loading, Time, useAccess, useTitle } from "../ui";
import { PublishTests, TestResults, TestsPanel, rememberRun } from "./PolicyTests";

const Bundles = graphql(`
  query Bundles {
    bundles(first: 50) { version state author comment createdAt publishedAt }
  }
`);
const BundleFiles = graphql(`
  query BundleFiles($version: Int) {
    bundle(version: $version) { version state author comment digest policies warnings files { name content } }
  }
`);
const Diff = graphql(`
  query BundleDiff($version: Int!) {
    bundleDiff(version: $version) { file change diff }
  }
`);
const DryRunQ = graphql(`
  query DryRun($version: Int!, $since: DateTime!) {
    dryRun(version: $version, since: $since, sample: 1000) {
      version decisions unchanged allowToDeny denyToAllow toChallenge fromChallenge errors truncated
      entities directoryVersion notes
      sample { qid at principal action resource recorded draft error }
      tests { version passed failed results { name passed expected got policies error notes } }
    }
  }
`);
const CreateDraft = graphql(`
  mutation CreateDraft($files: [BundleFileInput!]!, $comment: String!) {
    createDraft(files: $files, comment: $comment) { bundle { version } problems { field message } }
  }
`);
const Publish = graphql(`
  mutation Publish($version: Int!, $accept: [String!]) {
    publishBundle(version: $version, acceptFailingTests: $accept) { version state }
  }
`);
const Modes = graphql(`
  query Modes {
    enforcement { mode containmentMode }
    enforcementChanges(first: 10) { id at author containment fromMode toMode reason }
  }
`);
const SetMode = graphql(`
  mutation SetMode($mode: Mode!, $reason: String!, $containment: Boolean!) {
    setEnforcement(mode: $mode, reason: $reason, containment: $containment) { mode containmentMode }
  }
`);

export function PoliciesPage() {
  useTitle("Policies");
  return (
    <>
      <h1>Policies</h1>
      <ModesPanel />
      <BundlesPanel />
      <TestsPanel />
    </>
  );
}

const Impact = graphql(`
  query EnforcementImpact {
    enforcementImpact(hours: [24, 168]) { hours since until wouldDeny wouldChallenge wouldContain }
  }
`);

type ImpactRow = { hours: number; since: string; wouldDeny: number; wouldChallenge: number; wouldContain?: number | null };

const WINDOW: Record<number, string> = { 24: "last 24 hours", 168: "last 7 days" };

function plural(n: number, one: string, many = `${one}s`) {
  return `${n.toLocaleString()} ${n === 1 ? one : many}`;
}

/** What enforcing would have changed in one window, as a sentence. */
function impactText(r: ImpactRow, containment: boolean): string {
  const w = WINDOW[r.hours] ?? `last ${r.hours} hours`;
  if (containment)
    return r.wouldContain == null
      ? `${w}: not shown (you may not view investigations)`
      : `${w}: ${plural(r.wouldContain, "principal")} would have been contained`;
  return `${w}: ${plural(r.wouldDeny, "decision")} would have been denied and ${plural(r.wouldChallenge, "challenged", "challenged")}`;
}

function ModesPanel() {
  const { access } = useAccess();
  const client = useQueryClient();
  const q = useQuery({ queryKey: ["modes"], queryFn: () => gql(Modes), enabled: !!access.enforcement?.view });
  // Separate from the modes: the history's aggregate over a week may take a moment, the modes not.
  const impact = useQuery({
    queryKey: ["enforcement-impact"],
    queryFn: () => gql(Impact),
    enabled: !!access.enforcement?.view && !!access.decisions?.view,
  });
  const [reason, setReason] = useState("");
  const [pending, setPending] = useState<{ mode: Mode; containment: boolean } | null>(null);
  const m = useMutation({
    mutationFn: (v: { mode: Mode; containment: boolean }) => gql(SetMode, { ...v, reason }),
    onSuccess: () => {
      setPending(null);
      setReason("");
      return client.invalidateQueries({ queryKey: ["modes"] });
    },
  });
  if (!access.enforcement?.view)
    return (
      <section>
        <h2>Enforcement modes</h2>
        <p className="why">Not shown: {access.enforcement?.viewReason}</p>
      </section>
    );
  const rows = impact.data?.enforcementImpact ?? [];
  const scopes = q.data
    ? [
        { containment: false, name: "Install", id: "install", mode: q.data.enforcement.mode},
        {
          containment: true,
          name: "Automated containments",
          id: "containment",
          mode: q.data.enforcement.containmentMode,
        },
      ]
    : [];
  return (
    <section aria-labelledby="modes-h">
      <h2 id="modes-h">Enforcement modes</h2>
      {q.isPending && <Loading what="the modes" />}
      {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
      {q.data && (
        <>
          <p className="hint">
            In monitor mode denials are recorded as “would deny” and allowed, and the reasoner records “would
            contain” instead of containing; enforcing turns them into denials and containments. Beside each switch:
            what monitor mode recorded that enforcing would have turned into denials (search the decisions with mode
            monitor to see them).
          </p>
          <label className="reason">
            Reason for a change
            <input value={reason} onChange={(e) => setReason(e.target.value)} maxLength={500} />
          </label>
          <div className="scopes">
            {scopes.map((sc) => (
              <div className="scope" key={sc.id} role="group" aria-labelledby={`${sc.id}-mode-h`}>
                <h3 id={`${sc.id}-mode-h`}>
                  {sc.name}: <span id={`${sc.id}-mode`}>{sc.mode.toLowerCase()}</span>
                </h3>
                <ul className="impact" id={`${sc.id}-impact`} aria-live="polite">
                  {!access.decisions?.view && <li className="why">Counts not shown: {access.decisions?.viewReason}</li>}
                  {impact.isPending && access.decisions?.view && <li className="loading">Counting monitor mode's would-{sc.containment ? "contains" : "denies"}…</li>}
                  {impact.isError && <li className="error-text">The counts are not available: {String(impact.error.message)}</li>}
                  {rows.map((r) => (
                    <li key={r.hours} data-hours={r.hours}>
                      {impactText(r, sc.containment)} <span className="muted">(since <Time at={r.since} />)</span>
                    </li>
                  ))}
                </ul>
                <div className="inline">
                  {(["ENFORCE", "MONITOR"] as Mode[]).map((mode) => (
                    <Guarded
                      key={mode}
                      area="enforcement"
                      type="button"
                      disabled={sc.mode === mode}
                      onClick={() => setPending({ mode, containment: sc.containment })}
                    >
                      {sc.name}: {mode.toLowerCase()}
                    </Guarded>
                  ))}
                </div>
              </div>
            ))}
          </div>
          {pending && (
            <div className="confirm" role="alertdialog" aria-labelledby="confirm-mode" aria-describedby="confirm-impact">
              <p id="confirm-mode">
                Switch {pending.containment ? "automated containments" : "the install"} to{" "}
                <strong>{pending.mode.toLowerCase()}</strong>? Every decision point applies it within seconds.
              </p>
              <p id="confirm-impact">
                {pending.mode === "ENFORCE"
                  ? rows.length
                    ? `Had it been enforced: ${rows.map((r) => impactText(r, pending.containment)).join("; ")}.`
                    : "The would-deny counts are not available: search the decisions with mode monitor first."
                  : pending.containment
                    ? "From now on the reasoner records would-contains instead of containing anyone."
                    : "From now on denials are recorded as would-deny and allowed."}
              </p>
              <button type="button" className="danger" onClick={() => m.mutate(pending)} disabled={m.isPending}>
                Confirm: {pending.mode.toLowerCase()}
              </button>{" "}
              <button type="button" onClick={() => setPending(null)}>
                Cancel
              </button>
            </div>
          )}
          {m.isError && <ErrorBox error={m.error} />}
          {q.data.enforcementChanges.length > 0 && (
            <div className="scroll" tabIndex={0} role="region" aria-label="Mode changes">
              <table>
                <caption>Changes</caption>
                <thead>
                  <tr>
                    <th scope="col">When</th>
                    <th scope="col">Who</th>
                    <th scope="col">What</th>
                    <th scope="col">Reason</th>
                  </tr>
                </thead>
                <tbody>
                  {q.data.enforcementChanges.map((c) => (
                    <tr key={c.id}>
                      <td><Time at={c.at} /></td>
                      <td>{c.author}</td>
                      <td>
                        {c.containment ? "containments" : "install"}: {c.fromMode.toLowerCase()} → {c.toMode.toLowerCase()}
                      </td>
                      <td>{c.reason || "—"}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
        </>
      )}
    </section>
  );
}

function BundlesPanel() {
  const q = useQuery({ queryKey: ["bundles"], queryFn: () => gql(Bundles) });
  return (
    <section aria-labelledby="bundles-h">
      <h2 id="bundles-h">Bundles</h2>
      <p>
        <Link to="/policies/draft">Edit a new draft</Link> (from the active bundle's files)
      </p>
      {q.isPending && <Loading what="bundles" />}
      {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
      {q.data && q.data.bundles.length === 0 && <Empty>No bundle is published yet: make a draft and publish it.</Empty>}
      {q.data && q.data.bundles.length > 0 && (
        <div className="scroll" tabIndex={0} role="region" aria-label="Bundle versions">
          <table>
            <thead>
              <tr>
                <th scope="col">Version</th>
                <th scope="col">State</th>
                <th scope="col">Author</th>
                <th scope="col">Comment</th>
                <th scope="col">Made</th>
                <th scope="col">Published</th>
              </tr>
            </thead>
            <tbody>
              {q.data.bundles.map((b) => (
                <tr key={b.version}>
                  <td><Link to={`/policies/${b.version}`}>v{b.version}</Link></td>
                  <td><span className={`badge ${b.state === "ACTIVE" ? "allow" : ""}`}>{b.state.toLowerCase()}</span></td>
                  <td>{b.author}</td>
                  <td>{b.comment || "—"}</td>
                  <td><Time at={b.createdAt} /></td>
                  <td><Time at={b.publishedAt} /></td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}

/** One bundle version: its files, its diff against the active one, a dry run, publish. */
export function BundlePage() {
  const { version: v = "" } = useParams();
  const version = Number(v);
  useTitle(`Bundle v${version}`);
  const q = useQuery({ queryKey: ["bundle", version], queryFn: () => gql(BundleFiles, { version }) });
  const diff = useQuery({ queryKey: ["diff", version], queryFn: () => gql(Diff, { version }) });
  const [file, setFile] = useState<string | null>(null);
  if (q.isPending) return <Loading what="the bundle" />;
  if (q.isError) return <ErrorBox error={q.error} retry={() => q.refetch()} />;
  const b = q.data.bundle;
  if (!b) return <Empty>No bundle v{version}.</Empty>;
  const shown = b.files.find((f) => f.name === file) ?? b.files[0];
  return (
    <>
      <h1>
        Bundle v{b.version} <span className={`badge ${b.state === "ACTIVE" ? "allow" : ""}`}>{b.state.toLowerCase()}</span>
      </h1>
      <section aria-labelledby="files-h">
        <h2 id="files-h">Files</h2>
        <p>
          By {b.author}
          {b.comment && `: ${b.comment}`}. {b.policies.length} policies.
        </p>
        {b.warnings.length > 0 && (
          <ul className="why">
            {b.warnings.map((w) => (
              <li key={w}>{w}</li>
            ))}
          </ul>
        )}
        <div className="tabs" role="group" aria-label="Files">
          {b.files.map((f) => (
            <button key={f.name} type="button" aria-pressed={f.name === shown?.name} onClick={() => setFile(f.name)}>
              {f.name}
            </button>
          ))}
        </div>
        {shown && <CedarSource text={shown.content} label={`Source of ${shown.name}`} />}
      </section>
      <section aria-labelledby="diff-h">
        <h2 id="diff-h">Difference from the active bundle</h2>
        {diff.isPending && <Loading what="the difference" />}
        {diff.isError && <ErrorBox error={diff.error} retry={() => diff.refetch()} />}
        {diff.data && diff.data.bundleDiff.length === 0 && <Empty>The same files as the active bundle.</Empty>}
        {diff.data?.bundleDiff.map((d) => (
          <div key={d.file}>
            <h3>
              {d.file} <span className="muted">({d.change})</span>
            </h3>
            <div className="scroll" tabIndex={0} role="region" aria-label={`Difference of ${d.file}`}>
              <pre className="diff">
                {d.diff.split("\n").map((l, i) => (
                  <span key={i} className={l.startsWith("+") && !l.startsWith("+++") ? "add" : l.startsWith("-") && !l.startsWith("---") ? "del" : ""}>
                    {l}
                    {"\n"}
                  </span>
                ))}
              </pre>
            </div>
          </div>
        ))}
      </section>
      <DryRunPanel version={b.version} />
      {b.state === "ACTIVE" ? (
        <section aria-labelledby="pub-h">
          <h2 id="pub-h">Active</h2>
          <p id="active-note">v{b.version} is the active bundle: every decision point loads it within seconds.</p>
        </section>
      ) : (
        <PublishPanel version={b.version} rollback={b.state === "SUPERSEDED"} />
      )}
    </>
  );
}

function DryRunPanel({ version }: { version: number }) {
  const client = useQueryClient();
  const [days, setDays] = useState("1");
  const [from, setFrom] = useState("");
  const m = useMutation({
    mutationFn: () =>
      gql(DryRunQ, {
        version,
        // a datetime-local value is the viewer's own time; Date reads it so
        since: (days === "from" ? new Date(from) : new Date(Date.now() - Number(days) * 86_400_000)).toISOString(),
      }),
    onSuccess: (out) => rememberRun(client, out.dryRun.tests),
  });
  const r = m.data?.dryRun;
  return (
    <section aria-labelledby="dry-h">
      <h2 id="dry-h">Impact (dry run)</h2>
      <form
        className="inline"
        onSubmit={(e: FormEvent) => {
          e.preventDefault();
          m.mutate();
        }}
      >
        <label>
          Over the recorded checks of the last
          <select value={days} onChange={(e) => setDays(e.target.value)}>
            <option value="1">day</option>
            <option value="7">week</option>
            <option value="30">30 days</option>
            <option value="from">time since…</option>
          </select>
        </label>
        {days === "from" && (
          <label>
            Since (your time)
            <input
              type="datetime-local"
              name="since"
              data-volatile=""
              required
              value={from}
              max={new Date(Date.now() - new Date().getTimezoneOffset() * 60_000).toISOString().slice(0, 16)}
              onChange={(e) => setFrom(e.target.value)}
            />
          </label>
        )}
        <button type="submit" disabled={m.isPending || (days === "from" && !from)}>
          Run
        </button>
      </form>
      {m.isPending && <Loading what="the dry run" />}
      {m.isError && <ErrorBox error={m.error} />}
      {r && (
        <>
          <div className="counts" id="dry-run-counts">
            {(
              [
                [r.decisions, "decided again"],
                [r.unchanged, "unchanged"],
                [r.allowToDeny, "allow → deny"],
                [r.denyToAllow, "deny → allow"],
                [r.toChallenge, "→ challenge"],
                [r.fromChallenge, "challenge →"],
                [r.errors, "errors"],
              ] as [number, string][]
            ).map(([n, what]) => (
              <div key={what}>
                <strong>{n.toLocaleString()}</strong> <span>{what}</span>
              </div>
            ))}
          </div>
          <p className="hint" id="dry-run-entities">
            {r.entities === "directory"
              ? `Decided with the directory as the decision point sees it now (principals snapshot ${r.directoryVersion}) and the bundle's entities.`
              : "Decided with the bundle's own entities alone: checks that rest on groups or directory attributes may show as changed."}
          </p>
          {r.notes.length > 0 && (
            <ul className="why" aria-label="What the dry run could not use">
              {r.notes.map((n) => (
                <li key={n}>{n}</li>
              ))}
            </ul>
          )}
          {r.truncated && <p className="why">Only part of the range was decided again (the dry run's limit).</p>}
          {r.sample.length > 0 && <DryRunSample sample={r.sample} changed={r.decisions - r.unchanged} />}
          {r.tests && (
            <>
              <h3>Policy tests</h3>
              <TestResults run={r.tests} id="dry-run-tests" />
            </>
          )}
        </>
      )}
    </section>
  );
}

type Changed = {
  qid: string;
  at?: string | null;
  principal: string;
  action: string;
  resource: string;
  recorded: string;
  draft: string;
  error?: string | null;
};

/** `Type::id` (the dry run's form) as a link to the principal's page. */
function PrincipalRef({ text }: { text: string }) {
  const at = text.indexOf("::");
  if (at < 0) return <>{text}</>;
  const [type, id] = [text.slice(0, at), text.slice(at + 2).replace(/^"(.*)"$/, "$1")];
  return (
    <Link to={`/principals/${encodeURIComponent(type)}/${encodeURIComponent(id)}`}>
      {type}::"{id}"
    </Link>
  );
}

/**
 * The dry run's changed decisions grouped by change (recorded → draft), then by principal, an
 * agent marked as one: how many each principal has in the sample and up to three examples, each
 * linked to its decision.
 */
function DryRunSample({ sample, changed }: { sample: Changed[]; changed: number }) {
  const groups = new Map<string, Map<string, Changed[]>>();
  for (const c of sample) {
    const kind = `${c.recorded || "none"} → ${c.draft || "none"}`;
    const byWho = groups.get(kind) ?? new Map<string, Changed[]>();
    byWho.set(c.principal, [...(byWho.get(c.principal) ?? []), c]);
    groups.set(kind, byWho);
  }
  const count = (m: Map<string, Changed[]>) => [...m.values()].reduce((n, l) => n + l.length, 0);
  return (
    <div id="dry-run-sample">
      <h3>Changed decisions by change and principal</h3>
      <p className="hint">
        {sample.length < changed
          ? `The first ${sample.length.toLocaleString()} of ${changed.toLocaleString()} changed decisions`
          : `All ${changed.toLocaleString()} changed decisions`}
        , oldest first; each principal with up to three of its decisions.
      </p>
      {[...groups.entries()]
        .sort((a, b) => count(b[1]) - count(a[1]))
        .map(([kind, byWho]) => (
          <div key={kind} className="scroll" tabIndex={0} role="region" aria-label={`Changed: ${kind}`} data-change={kind}>
            <table>
              <caption>
                {kind}: {count(byWho).toLocaleString()} decision{count(byWho) === 1 ? "" : "s"} of{" "}
                {byWho.size.toLocaleString()} principal{byWho.size === 1 ? "" : "s"}
              </caption>
              <thead>
                <tr>
                  <th scope="col">Principal</th>
                  <th scope="col">Changed</th>
                  <th scope="col">For example</th>
                </tr>
              </thead>
              <tbody>
                {[...byWho.entries()]
                  .sort((a, b) => b[1].length - a[1].length || a[0].localeCompare(b[0]))
                  .map(([who, list]) => (
                    <tr key={who} data-principal={who}>
                      <th scope="row">
                        <PrincipalRef text={who} />
                        {who.startsWith("ServiceAccount::") && <span className="badge"> agent</span>}
                      </th>
                      <td>{list.length.toLocaleString()}</td>
                      <td>
                        <ul className="examples">
                          {list.slice(0, 3).map((c) => (
                            <li key={c.qid}>
                              <Link to={`/decisions/${encodeURIComponent(c.qid)}`}>
                                {c.action} on {c.resource}
                              </Link>{" "}
                              <Time at={c.at} />
                              {c.error && <span className="error-text"> {c.error}</span>}
                            </li>
                          ))}
                        </ul>
                      </td>
                    </tr>
                  ))}
              </tbody>
            </table>
          </div>
        ))}
    </div>
  );
}

function PublishPanel({ version, rollback }: { version: number; rollback: boolean }) {
  const client = useQueryClient();
  const [confirming, setConfirming] = useState(false);
  const [accepted, setAccepted] = useState<string[] | null>(null);
  const m = useMutation({
    mutationFn: () => gql(Publish, { version, accept: accepted ?? [] }),
    onSuccess: () => {
      setConfirming(false);
      return client.invalidateQueries();
    },
  });
  const verb = rollback ? "Roll back to" : "Publish";
  return (
    <section aria-labelledby="pub-h">
      <h2 id="pub-h">{rollback ? "Roll back" : "Publish"}</h2>
      <Guarded
        area="policies"
        type="button"
        className="danger"
        onClick={() => {
          setAccepted(null);
          setConfirming(true);
        }}
      >
        {verb} v{version}
      </Guarded>
      {confirming && (
        <div className="confirm" role="alertdialog" aria-labelledby="confirm-pub">
          <p id="confirm-pub">
            {verb} v{version}? It becomes the active bundle of every decision point. Run the dry run above first to see
            what it changes.
          </p>
          <PublishTests version={version} onAccepted={setAccepted} />
          <button type="button" className="danger" onClick={() => m.mutate()} disabled={m.isPending || accepted === null}>
            Confirm: {verb.toLowerCase()} v{version}
          </button>{" "}
          <button type="button" onClick={() => setConfirming(false)}>
            Cancel
          </button>
        </div>
      )}
      {m.isError && <ErrorBox error={m.error} />}
    </section>
  );
}

const PROBLEM = /^(.*):(\d+):(\d+)$/;

/** The draft editor: the active bundle's files, edited, validated and saved as a draft. */
export function DraftPage() {
  useTitle("New draft");
  const navigate = useNavigate();
  const q = useQuery({ queryKey: ["bundle", "active"], queryFn: () => gql(BundleFiles, { version: null }) });
  const [files, setFiles] = useState<{ name: string; content: string }[] | null>(null);
  const [current, setCurrent] = useState(0);
  const [comment, setComment] = useState("");
  useEffect(() => {
    if (q.data && files === null) setFiles(q.data.bundle?.files.map((f) => ({ name: f.name, content: f.content })) ?? []);
  }, [q.data, files]);
  const m = useMutation({
    mutationFn: () => gql(CreateDraft, { files: files ?? [], comment }),
    onSuccess: (out) => {
      if (out.createDraft.bundle) navigate(`/policies/${out.createDraft.bundle.version}`);
    },
  });
  if (q.isPending || files === null) return <Loading what="the active bundle" />;
  if (q.isError) return <ErrorBox error={q.error} retry={() => q.refetch()} />;
  const problems = m.data?.createDraft.problems ?? [];
  const byFile = new Map<string, Note[]>();
  const general: string[] = [];
  for (const p of problems) {
    const at = PROBLEM.exec(p.field);
    if (!at) {
      general.push(`${p.field}: ${p.message}`);
      continue;
    }
    const list = byFile.get(at[1]) ?? [];
    list.push({ line: Number(at[2]), column: Number(at[3]), message: p.message });
    byFile.set(at[1], list);
  }
  const file = files[current];
  return (
    <>
      <h1>New draft</h1>
      <section aria-labelledby="ed-h">
        <h2 id="ed-h">Files</h2>
        <div className="tabs" role="group" aria-label="Files">
          {files.map((f, i) => (
            <button key={f.name} type="button" aria-pressed={i === current} onClick={() => setCurrent(i)}>
              {f.name}
              {byFile.has(f.name) && ` (${byFile.get(f.name)!.length} problem${byFile.get(f.name)!.length > 1 ? "s" : ""})`}
            </button>
          ))}
        </div>
        {file && (
          <CedarEditor
            label={`Source of ${file.name}`}
            value={file.content}
            notes={byFile.get(file.name)}
            describedBy={byFile.has(file.name) ? "problems" : undefined}
            onChange={(text) => setFiles(files.map((f, i) => (i === current ? { ...f, content: text } : f)))}
          />
        )}
        <form
          className="inline"
          onSubmit={(e) => {
            e.preventDefault();
            m.mutate();
          }}
        >
          <label>
            Comment
            <input value={comment} onChange={(e) => setComment(e.target.value)} maxLength={500} />
          </label>
          <Guarded area="policies" type="submit" className="primary" disabled={m.isPending}>
            Validate and save the draft
          </Guarded>
        </form>
        {m.isError && <ErrorBox error={m.error} />}
      </section>
      {problems.length > 0 && (
        <section aria-labelledby="prob-h" id="problems">
          <h2 id="prob-h">
            {problems.length} problem{problems.length > 1 ? "s" : ""}: the draft was not saved
          </h2>
          {general.map((g) => (
            <p key={g} className="error-text">
              {g}
            </p>
          ))}
          {[...byFile.entries()].map(([name, notes]) => {
            const f = files.find((x) => x.name === name);
            return (
              <div key={name}>
                <h3>{name}</h3>
                {f ? (
                  <CedarSource text={f.content} label={`Problems in ${name}`} notes={notes} />
                ) : (
                  notes.map((n) => <p key={`${n.line}:${n.column}`}>{`line ${n.line}, column ${n.column}: ${n.message}`}</p>)
                )}
              </div>
            );
          })}
        </section>
      )}
    </>
  );
}
