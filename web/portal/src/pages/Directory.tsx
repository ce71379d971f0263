// Directory: people, groups (from the people's memberships), service accounts and agents, and
// the trusted apps (add, remove).
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";
import { Link } from "react-router-dom";
import { gql } from "../api";
import { graphql } from "../gql";
import { Empty, ErrorBox, Guarded, Loading, Time, useTitle } from "../ui";

const Dir = graphql(`
  query Directory {
    people(includeRemoved: false) { userName displayName active department title groups }
    serviceAccounts { id owner ai groups description app }
  }
`);
const Apps = graphql(`
  query TrustedApps {
    trustedApps { name iss jwksUrl aud createdAt }
  }
`);
const Trust = graphql(`
  mutation TrustApp($app: TrustedAppInput!) {
    trustApp(app: $app) { name }
  }
`);
const Untrust = graphql(`
  mutation UntrustApp($name: String!) {
    untrustApp(name: $name)
  }
`);

const person = (u: string) => `/principals/Human/${encodeURIComponent(u)}`;

export function DirectoryPage() {
  useTitle("Directory");
  const q = useQuery({ queryKey: ["directory"], queryFn: () => gql(Dir) });
  const groups = new Map<string, string[]>();
  for (const p of q.data?.people ?? []) for (const g of p.groups) groups.set(g, [...(groups.get(g) ?? []), p.userName]);
  return (
    <>
      <h1>Directory</h1>
      {q.isPending && <Loading what="the directory" />}
      {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
      {q.data && (
        <>
          <section aria-labelledby="people-h">
            <h2 id="people-h">People ({q.data.people.length})</h2>
            {q.data.people.length === 0 ? (
              <Empty>Nobody is provisioned (SCIM, docs/directory.md).</Empty>
            ) : (
              <div className="scroll" tabIndex={0} role="region" aria-label="People">
                <table>
                  <thead>
                    <tr>
                      <th scope="col">User</th>
                      <th scope="col">Name</th>
                      <th scope="col">Title</th>
                      <th scope="col">Department</th>
                      <th scope="col">Groups</th>
                      <th scope="col">State</th>
                    </tr>
                  </thead>
                  <tbody>
                    {q.data.people.map((p) => (
                      <tr key={p.userName}>
                        <td><Link to={person(p.userName)}>{p.userName}</Link></td>
                        <td>{p.displayName ?? "—"}</td>
                        <td>{p.title ?? "—"}</td>
                        <td>{p.department ?? "—"}</td>
                        <td>{p.groups.join(", ") || "—"}</td>
                        <td>{p.active ? "active" : "inactive"}</td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </div>
            )}
          </section>
          <section aria-labelledby="groups-h">
            <h2 id="groups-h">Groups ({groups.size})</h2>
            {groups.size === 0 ? (
              <Empty>No group has members.</Empty>
            ) : (
              <dl>
                {[...groups.entries()].sort().map(([g, members]) => (
                  <div key={g} className="contents">
                    <dt>{g}</dt>
                    <dd>
                      {members.map((m, i) => (
                        <span key={m}>
                          {i > 0 && ", "}
                          <Link to={person(m)}>{m}</Link>
                        </span>
                      ))}
                    </dd>
                  </div>
                ))}
              </dl>
            )}
          </section>
          <section aria-labelledby="agents-h">
            <h2 id="agents-h">Service accounts and agents ({q.data.serviceAccounts.length})</h2>
            {q.data.serviceAccounts.length === 0 ? (
              <Empty>No service account is registered: trusted apps register their agents at /api/v1/agents.</Empty>
            ) : (
              <div className="scroll" tabIndex={0} role="region" aria-label="Service accounts">
                <table>
                  <thead>
                    <tr>
                      <th scope="col">Id</th>
                      <th scope="col">Owner</th>
                      <th scope="col">App</th>
                      <th scope="col">AI</th>
                      <th scope="col">Description</th>
                    </tr>
                  </thead>
                  <tbody>
                    {q.data.serviceAccounts.map((a) => (
                      <tr key={a.id}>
                        <td><Link to={`/principals/ServiceAccount/${encodeURIComponent(a.id)}`}>{a.id}</Link></td>
                        <td><Link to={person(a.owner)}>{a.owner}</Link></td>
                        <td>{a.app || "—"}</td>
                        <td>{a.ai ? "yes" : "no"}</td>
                        <td>{a.description || "—"}</td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </div>
            )}
          </section>
        </>
      )}
      <TrustedApps />
    </>
  );
}

function TrustedApps() {
  const client = useQueryClient();
  const q = useQuery({ queryKey: ["apps"], queryFn: () => gql(Apps) });
  const [app, setApp] = useState({ name: "", iss: "", jwksUrl: "", aud: "svc-portal" });
  const refresh = () => client.invalidateQueries({ queryKey: ["apps"] });
  const add = useMutation({
    mutationFn: () => gql(Trust, { app }),
    onSuccess: () => {
      setApp({ name: "", iss: "", jwksUrl: "", aud: "svc-portal" });
      return refresh();
    },
  });
  const remove = useMutation({ mutationFn: (name: string) => gql(Untrust, { name }), onSuccess: refresh });
  const field = (k: keyof typeof app, label: string) => (
    <label>
      {label}
      <input value={app[k]} onChange={(e) => setApp({ ...app, [k]: e.target.value })} required />
    </label>
  );
  return (
    <section aria-labelledby="apps-h">
      <h2 id="apps-h">Trusted apps</h2>
      {q.isPending && <Loading what="trusted apps" />}
      {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
      {remove.isError && <ErrorBox error={remove.error} />}
      {q.data && q.data.trustedApps.length === 0 && <Empty>No app is trusted to sign agent tokens.</Empty>}
      {q.data && q.data.trustedApps.length > 0 && (
        <div className="scroll" tabIndex={0} role="region" aria-label="Trusted apps">
          <table>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Issuer</th>
                <th scope="col">JWKS</th>
                <th scope="col">Audience</th>
                <th scope="col">Since</th>
                <th scope="col">Remove</th>
              </tr>
            </thead>
            <tbody>
              {q.data.trustedApps.map((a) => (
                <tr key={a.name}>
                  <td>{a.name}</td>
                  <td>{a.iss}</td>
                  <td className="wrap">{a.jwksUrl}</td>
                  <td>{a.aud}</td>
                  <td><Time at={a.createdAt} /></td>
                  <td>
                    <Guarded area="directory" type="button" aria-label={`Remove ${a.name}`} onClick={() => remove.mutate(a.name)}>
                      Remove
                    </Guarded>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      <h3>Trust an app</h3>
      <form
        className="inline"
        onSubmit={(e: FormEvent) => {
          e.preventDefault();
          add.mutate();
        }}
      >
        {field("name", "Name")}
        {field("iss", "Issuer (iss)")}
        {field("jwksUrl", "JWKS URL (https)")}
        {field("aud", "Audience (aud)")}
        <Guarded area="directory" type="submit" disabled={add.isPending}>
          Trust
        </Guarded>
      </form>
      {add.isError && <ErrorBox error={add.error} />}
    </section>
  );
}
