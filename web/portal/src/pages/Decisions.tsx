// Decisions: the history of one principal or one resource, with filters and cursor paging.
import { useQuery } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";
import { Link, useSearchParams } from "react-router-dom";
import { gql } from "../api";
import { graphql } from "../gql";
import { Empty, ErrorBox, Loading, Principal, Time, Verdict, useTitle } from "../ui";

const Search = graphql(`
  query DecisionSearch(
    $principal: EntityRefInput
    $resource: EntityRefInput
    $action: String
    $verdict: String
    $policy: String
    $mode: String
    $since: DateTime
    $until: DateTime
    $first: Int!
    $after: String
  ) {
    decisions(
      principal: $principal
      resource: $resource
      action: $action
      verdict: $verdict
      policy: $policy
      mode: $mode
      since: $since
      until: $until
      first: $first
      after: $after
    ) {
      decisions {
        qid
        at
        principal { type id }
        onBehalfOf { type id }
        action
        resource { type id }
        verdict
        mode
        would
        policies
      }
      endCursor
      hasNextPage
      scanned
    }
  }
`);

const FIELDS = ["subject", "type", "id", "action", "verdict", "policy", "mode", "since", "until"] as const;
const PAGE = 25;

/** A `datetime-local` value (the viewer's zone) as an ISO instant; empty: none. */
function instant(local: string | null): string | null {
  if (!local) return null;
  const d = new Date(local);
  return Number.isNaN(d.getTime()) ? null : d.toISOString();
}

export function DecisionsPage() {
  useTitle("Decisions");
  const [params, setParams] = useSearchParams();
  const [cursors, setCursors] = useState<(string | null)[]>([null]);
  const after = cursors[cursors.length - 1];
  const id = params.get("id");
  const type = params.get("type") || "Human";
  const subject = params.get("subject") === "resource" ? "resource" : "principal";
  const vars = {
    principal: subject === "principal" && id ? { type, id } : null,
    resource: subject === "resource" && id ? { type, id } : null,
    action: params.get("action") || null,
    verdict: params.get("verdict") || null,
    policy: params.get("policy") || null,
    mode: params.get("mode") || null,
    since: instant(params.get("since")),
    until: instant(params.get("until")),
    first: PAGE,
    after,
  };
  const q = useQuery({
    queryKey: ["decisions", vars],
    queryFn: () => gql(Search, vars),
    enabled: !!id,
  });

  function submit(e: FormEvent<HTMLFormElement>) {
    e.preventDefault();
    const form = new FormData(e.currentTarget);
    const next = new URLSearchParams();
    for (const f of FIELDS) {
      const v = String(form.get(f) ?? "").trim();
      if (v) next.set(f, v);
    }
    setCursors([null]);
    setParams(next);
  }

  const page = q.data?.decisions;
  return (
    <>
      <h1>Decisions</h1>
      <section aria-labelledby="search-h">
        <h2 id="search-h">Search</h2>
        <form className="search" onSubmit={submit} key={params.toString()}>
          <label>
            Of
            <select name="subject" defaultValue={subject}>
              <option value="principal">a principal</option>
              <option value="resource">a resource</option>
            </select>
          </label>
          <label>
            Type
            <input name="type" defaultValue={type} required />
          </label>
          <label>
            Id
            <input name="id" defaultValue={id ?? ""} required placeholder="e.g. diego.larsen" />
          </label>
          <label>
            Action
            <input name="action" defaultValue={params.get("action") ?? ""} />
          </label>
          <label>
            Verdict
            <select name="verdict" defaultValue={params.get("verdict") ?? ""}>
              <option value="">any</option>
              <option value="allow">allow</option>
              <option value="deny">deny</option>
              <option value="challenge">challenge</option>
            </select>
          </label>
          <label>
            Policy
            <input name="policy" defaultValue={params.get("policy") ?? ""} />
          </label>
          <label>
            Mode
            <select name="mode" defaultValue={params.get("mode") ?? ""}>
              <option value="">any</option>
              <option value="enforce">enforce</option>
              <option value="monitor">monitor</option>
            </select>
          </label>
          <label>
            Since
            <input type="datetime-local" name="since" defaultValue={params.get("since") ?? ""} />
          </label>
          <label>
            Until
            <input type="datetime-local" name="until" defaultValue={params.get("until") ?? ""} />
          </label>
          <div className="actions">
            <button type="submit" className="primary">
              Search
            </button>
          </div>
        </form>
        <p className="hint">Without a range, the last day is searched, oldest first.</p>
      </section>
      <section aria-labelledby="results-h" aria-busy={q.isFetching}>
        <h2 id="results-h">Results</h2>
        {!id && <Empty>Name a principal or a resource to search its decisions.</Empty>}
        {id && q.isPending && <Loading what="decisions" />}
        {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
        {page && page.decisions.length === 0 && (
          <Empty>No decision matches in this range ({page.scanned} read). Widen the range or drop a filter.</Empty>
        )}
        {page && page.decisions.length > 0 && (
          <div className="scroll" tabIndex={0} role="region" aria-label="Decisions found">
            <table>
              <thead>
                <tr>
                  <th scope="col">When</th>
                  <th scope="col">Principal</th>
                  <th scope="col">Action</th>
                  <th scope="col">Resource</th>
                  <th scope="col">Verdict</th>
                  <th scope="col">Policies</th>
                  <th scope="col">Decision</th>
                </tr>
              </thead>
              <tbody>
                {page.decisions.map((d) => (
                  <tr key={d.qid}>
                    <td><Time at={d.at} /></td>
                    <td><Principal p={d.principal} /></td>
                    <td>{d.action}</td>
                    <td>{d.resource ? `${d.resource.type}::"${d.resource.id}"` : "—"}</td>
                    <td>
                      <Verdict v={d.verdict} />
                      {d.mode === "monitor" && d.would && <span className="muted"> would {d.would}</span>}
                    </td>
                    <td>{d.policies.join(", ") || <span className="muted">none</span>}</td>
                    <td>
                      <Link to={`/decisions/${d.qid}`} aria-label={`Explain decision ${d.qid}`}>
                        Explain
                      </Link>
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
        {page && (
          <div className="pager">
            <button type="button" disabled={cursors.length < 2} onClick={() => setCursors(cursors.slice(0, -1))}>
              Previous page
            </button>
            <span>Page {cursors.length}</span>
            <button
              type="button"
              disabled={!page.hasNextPage}
              onClick={() => setCursors([...cursors, page.endCursor ?? null])}
            >
              Next page
            </button>
          </div>
        )}
      </section>
    </>
  );
}
