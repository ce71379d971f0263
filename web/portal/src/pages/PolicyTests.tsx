// Policy tests (docs/portal.md#policy-tests): decisions saved as tests from their page, listed on
// the Policies page with the results of the last run, decided by every dry run, and named by the
// publish confirmation when they fail.
import { useMutation, useQuery, useQueryClient, type QueryClient } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";
import { Link } from "react-router-dom";
import { gql } from "../api";
import { graphql } from "../gql";
import { Empty, ErrorBox, Guarded, Loading, Time, Verdict, useAccess } from "../ui";

const Tests = graphql(`
  query PolicyTests {
    policyTests {
      name action expect savedBy fromDecision createdAt
      principal { type id } resource { type id } onBehalfOf { type id }
    }
  }
`);
const RunTests = graphql(`
  query RunPolicyTests($version: Int!) {
    runPolicyTests(version: $version) {
      version passed failed results { name passed expected got policies error notes }
    }
  }
`);
const DeleteTest = graphql(`
  mutation DeletePolicyTest($name: String!) {
    deletePolicyTest(name: $name)
  }
`);

/** A run of the tests, as the GraphQL `TestRun` type has it. */
export interface TestRunView {
  version: number;
  passed: number;
  failed: number;
  results: {
    name: string;
    passed: boolean;
    expected: string;
    got: string;
    policies: string[];
    error?: string | null;
    notes: string[];
  }[];
}

/** The cache key of the last run (a dry run's, or one asked for on the Policies page). */
const LAST_RUN = ["policy-test-run"];

/** Keeps `run` as the last run, which the Policies page's tests section shows. */
export function rememberRun(client: QueryClient, run: TestRunView | null | undefined) {
  if (run) client.setQueryData(LAST_RUN, run);
}

function ref(r?: { type: string; id: string } | null) {
  return r ? `${r.type}::"${r.id}"` : "—";
}

/** A run's results: the failing tests first, each with what it expected and what it got. */
export function TestResults({ run, id }: { run: TestRunView; id?: string }) {
  const failing = run.results.filter((r) => !r.passed);
  return (
    <div id={id}>
      <p>
        <strong>{run.passed}</strong> passed, <strong>{run.failed}</strong> failed under v{run.version}.
        {run.results.length === 0 && " No policy test is saved yet: save one from a decision's page."}
      </p>
      {failing.length > 0 && (
        <div className="scroll" tabIndex={0} role="region" aria-label={`Failing policy tests under v${run.version}`}>
          <table className="failing-tests">
            <caption>Failing tests</caption>
            <thead>
              <tr>
                <th scope="col">Test</th>
                <th scope="col">Expected</th>
                <th scope="col">Got</th>
                <th scope="col">Deciding policies</th>
              </tr>
            </thead>
            <tbody>
              {failing.map((r) => (
                <tr key={r.name}>
                  <td>{r.name}</td>
                  <td><Verdict v={r.expected} /></td>
                  <td>
                    <Verdict v={r.got} />
                    {r.error && <span className="error-text"> {r.error}</span>}
                  </td>
                  <td>{r.policies.join(", ") || "none (deny by default)"}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </div>
  );
}

/** The Policies page's section: saved tests, delete, the last run's results, run again. */
export function TestsPanel() {
  const client = useQueryClient();
  const { access } = useAccess();
  const q = useQuery({ queryKey: ["policy-tests"], queryFn: () => gql(Tests), enabled: !!access.policies?.view });
  const last = useQuery<TestRunView | null>({ queryKey: LAST_RUN, queryFn: () => null, enabled: false, staleTime: Infinity });
  const [version, setVersion] = useState("");
  const run = useMutation({
    mutationFn: () => gql(RunTests, { version: version ? Number(version) : 0 }),
    onSuccess: (out) => rememberRun(client, out.runPolicyTests),
  });
  const del = useMutation({
    mutationFn: (name: string) => gql(DeleteTest, { name }),
    onSuccess: () => client.invalidateQueries({ queryKey: ["policy-tests"] }),
  });
  if (!access.policies?.view)
    return (
      <section>
        <h2 id="tests-h">Policy tests</h2>
        <p className="why">Not shown: {access.policies?.viewReason}</p>
      </section>
    );
  const results = new Map((last.data?.results ?? []).map((r) => [r.name, r]));
  return (
    <section aria-labelledby="tests-h">
      <h2 id="tests-h">Policy tests</h2>
      <p className="hint">
        Decisions saved as tests from their page. Every dry run and publish decides them again; a publish whose tests
        fail asks you to accept each failure by name.
      </p>
      {q.isPending && <Loading what="the policy tests" />}
      {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
      {q.data && q.data.policyTests.length === 0 && (
        <Empty>No policy test is saved yet: open a decision and use “Save as a test”.</Empty>
      )}
      {q.data && q.data.policyTests.length > 0 && (
        <div className="scroll" tabIndex={0} role="region" aria-label="Policy tests">
          <table id="policy-tests">
            <thead>
              <tr>
                <th scope="col">Test</th>
                <th scope="col">Request</th>
                <th scope="col">Expects</th>
                <th scope="col">{last.data ? `Under v${last.data.version}` : "Last run"}</th>
                <th scope="col">Saved</th>
                <th scope="col">Actions</th>
              </tr>
            </thead>
            <tbody>
              {q.data.policyTests.map((t) => {
                const r = results.get(t.name);
                return (
                  <tr key={t.name}>
                    <td>
                      {t.name}
                      {t.fromDecision && (
                        <>
                          {" "}
                          <Link to={`/decisions/${t.fromDecision}`} aria-label={`The decision ${t.name} was saved from`}>
                            (decision)
                          </Link>
                        </>
                      )}
                    </td>
                    <td>
                      {ref(t.principal)} {t.action} {ref(t.resource)}
                      {t.onBehalfOf && <> for {ref(t.onBehalfOf)}</>}
                    </td>
                    <td><Verdict v={t.expect} /></td>
                    <td>
                      {!r ? (
                        <span className="muted">—</span>
                      ) : r.passed ? (
                        <span className="badge passed">passed</span>
                      ) : (
                        <span className="test-failed">
                          <span className="badge deny">failed</span> expected {r.expected}, got {r.got}
                          {r.policies.length > 0 && ` (by ${r.policies.join(", ")})`}
                        </span>
                      )}
                    </td>
                    <td>
                      {t.savedBy}, <Time at={t.createdAt} />
                    </td>
                    <td>
                      <Guarded
                        area="policies"
                        type="button"
                        disabled={del.isPending}
                        aria-label={`Delete the test ${t.name}`}
                        onClick={() => del.mutate(t.name)}
                      >
                        Delete
                      </Guarded>
                    </td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </div>
      )}
      {del.isError && <ErrorBox error={del.error} />}
      <form
        className="inline"
        onSubmit={(e: FormEvent) => {
          e.preventDefault();
          run.mutate();
        }}
      >
        <label>
          Run the tests under version (empty: the active one)
          <input inputMode="numeric" pattern="[0-9]*" value={version} onChange={(e) => setVersion(e.target.value)} />
        </label>
        <button type="submit" disabled={run.isPending}>
          Run the tests
        </button>
      </form>
      {run.isPending && <Loading what="the tests" />}
      {run.isError && <ErrorBox error={run.error} />}
      {last.data && <TestResults run={last.data} id="tests-last-run" />}
    </section>
  );
}

/** The publish confirmation's part: the tests decided under `version`, the failing ones named,
 * each to be accepted before the publish may go on. Calls `onAccepted` with the names accepted
 * (empty when none fail), or null while failures are not all accepted. */
export function PublishTests({
  version,
  onAccepted,
}: {
  version: number;
  onAccepted: (names: string[] | null) => void;
}) {
  const client = useQueryClient();
  const [accepted, setAccepted] = useState(false);
  const q = useQuery({
    queryKey: ["policy-test-run", "publish", version],
    queryFn: async () => {
      const out = await gql(RunTests, { version });
      rememberRun(client, out.runPolicyTests);
      const failing = out.runPolicyTests.results.filter((r) => !r.passed).map((r) => r.name);
      onAccepted(failing.length === 0 ? [] : null);
      return out.runPolicyTests;
    },
    staleTime: 0,
  });
  if (q.isPending) return <Loading what="the policy tests under this version" />;
  if (q.isError) return <ErrorBox error={q.error} retry={() => q.refetch()} />;
  const failing = q.data.results.filter((r) => !r.passed);
  if (failing.length === 0)
    return <p id="publish-tests">All {q.data.results.length} policy tests pass under v{version}.</p>;
  return (
    <div id="publish-tests">
      <p className="error-text">
        {failing.length} policy test{failing.length > 1 ? "s fail" : " fails"} under v{version}:{" "}
        {failing.map((r) => r.name).join(", ")}.
      </p>
      <TestResults run={q.data} />
      <label>
        <input
          type="checkbox"
          checked={accepted}
          onChange={(e) => {
            setAccepted(e.target.checked);
            onAccepted(e.target.checked ? failing.map((r) => r.name) : null);
          }}
        />{" "}
        I accept {failing.length > 1 ? "these failures" : "this failure"} (recorded with the publish)
      </label>
    </div>
  );
}
