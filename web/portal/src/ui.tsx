// Small pieces every page uses: times in the viewer's zone, loading, empty and error states,
// verdict badges, links to principals, the access a person has.
import { createContext, useContext, useEffect, useId, type ReactNode } from "react";
import { Link } from "react-router-dom";
import { ApiError } from "./api";
import type { AreaAccess } from "./gql/graphql";

const fmt = new Intl.DateTimeFormat(undefined, {
  dateStyle: "medium",
  timeStyle: "medium",
});

/** A time in the viewer's own zone, the exact instant (UTC) in its tooltip. */
export function Time({ at }: { at?: string | null }) {
  if (!at) return <span className="muted">—</span>;
  const d = new Date(at);
  return (
    <time dateTime={d.toISOString()} title={d.toISOString()} data-volatile="">
      {fmt.format(d)}
    </time>
  );
}

export function Loading({ what }: { what: string }) {
  return (
    <p className="loading" role="status" aria-live="polite">
      Loading {what}…
    </p>
  );
}

export function Empty({ children }: { children: ReactNode }) {
  return <p className="empty">{children}</p>;
}

/** An error with what to do next: a refusal names its decision, anything else says retry. */
export function ErrorBox({ error, retry }: { error: unknown; retry?: () => void }) {
  const e = error instanceof ApiError ? error : null;
  let next = "Try again in a moment; if it persists, the portal's log names the service that failed.";
  if (e?.code === "FORBIDDEN")
    next = "Your access does not include this. Ask a security administrator if you need it.";
  if (e?.code === "SERVICE_UNAVAILABLE" || e?.code === "HTTP_503")
    next = "A service the portal calls does not answer; try again shortly.";
  if (e?.message.includes("SVC_PORTAL_"))
    next = "The portal is not set up for this: ask whoever runs svc to set the setting named above.";
  if (e?.code === "PERSISTED_QUERY_NOT_FOUND" || e?.code === "HTTP_400")
    next = "The portal may have been upgraded: reload the page.";
  return (
    <div className="error" role="alert">
      <strong>{error instanceof Error ? error.message : String(error)}</strong>
      <p>{next}</p>
      {e?.decisionQid && (
        <p>
          Decision: <Link to={`/decisions/${e.decisionQid}`}><code>{e.decisionQid}</code></Link>
        </p>
      )}
      {retry && (
        <button type="button" onClick={retry}>
          Try again
        </button>
      )}
    </div>
  );
}

export function Verdict({ v }: { v?: string | null }) {
  const name = v ?? "unknown";
  return <span className={`badge ${name}`}>{name}</span>;
}

export function Principal({ p }: { p?: { type: string; id: string } | null }) {
  if (!p) return <span className="muted">—</span>;
  return (
    <Link to={`/principals/${encodeURIComponent(p.type)}/${encodeURIComponent(p.id)}`}>
      {p.type}::"{p.id}"
    </Link>
  );
}

/** Sets the document's title (each page names itself for screen readers and history). */
export function useTitle(title: string) {
  useEffect(() => {
    document.title = `${title} · svc portal`;
  }, [title]);
}

export type Access = Record<string, AreaAccess>;
export const AccessContext = createContext<{ user: string; access: Access }>({
  user: "",
  access: {},
});

export function useAccess() {
  return useContext(AccessContext);
}

/** A button a person may not use is disabled, and says why. */
export function Guarded({
  area,
  children,
  ...props
}: { area: string; children: ReactNode } & React.ButtonHTMLAttributes<HTMLButtonElement>) {
  const { access } = useAccess();
  const id = useId();
  const a = access[area];
  const allowed = !!a?.administer;
  const reason = allowed ? undefined : `You may not change ${area}: ${a?.administerReason ?? "no access"}`;
  return (
    <span className="guarded">
      <button {...props} disabled={!allowed || props.disabled} title={reason} aria-describedby={allowed ? undefined : id}>
        {children}
      </button>
      {!allowed && (
        <span className="why" id={id}>
          Not allowed: the decision point denies you <code>administer</code> on {area}.
        </span>
      )}
    </span>
  );
}
