// Containments: every contained principal, lift one, contain one by its type and id.
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState, type FormEvent } from "react";
import { gql } from "../api";
import { graphql } from "../gql";
import { ContainmentsLive, LiveStatus, pollUnlessLive, useLiveQueries } from "../live";
import { Empty, ErrorBox, Guarded, Loading, Principal, Time, useAccess, useTitle } from "../ui";

const List = graphql(`
  query AllContainments {
    containments { principal { type id } reason author containedAt }
  }
`);
const ContainOne = graphql(`
  mutation ContainOne($principal: EntityRefInput!, $reason: String!) {
    contain(principal: $principal, reason: $reason) { changed }
  }
`);
const LiftOne = graphql(`
  mutation LiftOne($principal: EntityRefInput!, $reason: String!) {
    lift(principal: $principal, reason: $reason)
  }
`);

export function ContainmentsPage() {
  useTitle("Containments");
  const client = useQueryClient();
  const { access } = useAccess();
  // Each contain and lift, wherever it was made, refreshes the list (docs/portal.md#live-updates).
  const live = useLiveQueries(ContainmentsLive, {}, [["containments"], ["containments-ov"]], !!access.containments?.view);
  const q = useQuery({ queryKey: ["containments"], queryFn: () => gql(List), refetchInterval: pollUnlessLive(live) });
  const [type, setType] = useState("Human");
  const [id, setId] = useState("");
  const [reason, setReason] = useState("");
  const refresh = () => client.invalidateQueries({ queryKey: ["containments"] });
  const contain = useMutation({
    mutationFn: () => gql(ContainOne, { principal: { type, id }, reason }),
    onSuccess: () => {
      setId("");
      setReason("");
      return refresh();
    },
  });
  const lift = useMutation({
    mutationFn: (p: { type: string; id: string }) => gql(LiftOne, { principal: p, reason: "lifted in the portal" }),
    onSuccess: refresh,
  });
  return (
    <>
      <div className="page-head">
        <h1>Containments</h1>
        <LiveStatus state={live} />
      </div>
      <section aria-labelledby="new-h">
        <h2 id="new-h">Contain a principal</h2>
        <form
          className="inline"
          onSubmit={(e: FormEvent) => {
            e.preventDefault();
            if (window.confirm(`Contain ${type}::"${id}"? Every decision point denies it everything.`)) contain.mutate();
          }}
        >
          <label>
            Type
            <select value={type} onChange={(e) => setType(e.target.value)}>
              <option>Human</option>
              <option>ServiceAccount</option>
            </select>
          </label>
          <label>
            Id
            <input value={id} onChange={(e) => setId(e.target.value)} required />
          </label>
          <label>
            Reason
            <input value={reason} onChange={(e) => setReason(e.target.value)} required maxLength={500} />
          </label>
          <Guarded area="containments" type="submit" className="danger" disabled={contain.isPending}>
            Contain
          </Guarded>
        </form>
        {contain.isError && <ErrorBox error={contain.error} />}
      </section>
      <section aria-labelledby="list-h">
        <h2 id="list-h">Contained now</h2>
        {q.isPending && <Loading what="containments" />}
        {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
        {lift.isError && <ErrorBox error={lift.error} />}
        {q.data && q.data.containments.length === 0 && <Empty>Nobody is contained.</Empty>}
        {q.data && q.data.containments.length > 0 && (
          <div className="scroll" tabIndex={0} role="region" aria-label="Contained principals">
            <table>
              <thead>
                <tr>
                  <th scope="col">Principal</th>
                  <th scope="col">Reason</th>
                  <th scope="col">By</th>
                  <th scope="col">Since</th>
                  <th scope="col">Lift</th>
                </tr>
              </thead>
              <tbody>
                {q.data.containments.map((c) => (
                  <tr key={`${c.principal.type}/${c.principal.id}`}>
                    <td><Principal p={c.principal} /></td>
                    <td>{c.reason}</td>
                    <td>{c.author}</td>
                    <td><Time at={c.containedAt} /></td>
                    <td>
                      <Guarded
                        area="containments"
                        type="button"
                        aria-label={`Lift ${c.principal.type} ${c.principal.id}`}
                        onClick={() => lift.mutate({ type: c.principal.type, id: c.principal.id })}
                      >
                        Lift
                      </Guarded>
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </section>
    </>
  );
}
