// Investigations: the reasoner's and people's investigations of a principal; close one.
import { useMutation, useQuery, useQueryClient } from "@tanstack/react-query";
import { useState } from "react";
import { gql } from "../api";
import { graphql } from "../gql";
import { Empty, ErrorBox, Guarded, Loading, Time, useTitle } from "../ui";

const List = graphql(`
  query Investigations($status: String) {
    investigations(status: $status) { id principal reason openedBy openedAt status closedBy closedAt resolution }
  }
`);
const Close = graphql(`
  mutation CloseInvestigation($id: String!, $resolution: String!) {
    closeInvestigation(id: $id, resolution: $resolution) { id status }
  }
`);

export function InvestigationsPage() {
  useTitle("Investigations");
  const client = useQueryClient();
  const [status, setStatus] = useState("open");
  const q = useQuery({ queryKey: ["investigations", status], queryFn: () => gql(List, { status: status || null }) });
  const [resolutions, setResolutions] = useState<Record<string, string>>({});
  const close = useMutation({
    mutationFn: (id: string) => gql(Close, { id, resolution: resolutions[id] ?? "" }),
    onSuccess: () => client.invalidateQueries({ queryKey: ["investigations"] }),
  });
  return (
    <>
      <h1>Investigations</h1>
      <section aria-labelledby="inv-h" aria-busy={q.isFetching}>
        <h2 id="inv-h">Investigations</h2>
        <label className="check">
          Status
          <select value={status} onChange={(e) => setStatus(e.target.value)}>
            <option value="open">open</option>
            <option value="closed">closed</option>
            <option value="">any</option>
          </select>
        </label>
        {q.isPending && <Loading what="investigations" />}
        {q.isError && <ErrorBox error={q.error} retry={() => q.refetch()} />}
        {close.isError && <ErrorBox error={close.error} />}
        {q.data && q.data.investigations.length === 0 && (
          <Empty>No {status} investigation. The reasoner opens one when a principal's risk calls for it.</Empty>
        )}
        <ul className="cards">
          {q.data?.investigations.map((i) => (
            <li key={i.id} className="card">
              <h3>{i.principal}</h3>
              <dl>
                <dt>Why</dt>
                <dd>{i.reason}</dd>
                <dt>Opened</dt>
                <dd>
                  by {i.openedBy}, <Time at={i.openedAt} />
                </dd>
                <dt>Status</dt>
                <dd>{i.status}</dd>
                {i.closedBy && (
                  <>
                    <dt>Closed</dt>
                    <dd>
                      by {i.closedBy}, <Time at={i.closedAt} />: {i.resolution}
                    </dd>
                  </>
                )}
              </dl>
              {i.status === "open" && (
                <div className="inline">
                  <label>
                    Resolution
                    <input value={resolutions[i.id] ?? ""} onChange={(e) => setResolutions({ ...resolutions, [i.id]: e.target.value })} />
                  </label>
                  <Guarded area="investigations" type="button" onClick={() => close.mutate(i.id)}>
                    Close
                  </Guarded>
                </div>
              )}
            </li>
          ))}
        </ul>
      </section>
    </>
  );
}
