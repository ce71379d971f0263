// The portal's API as the app calls it: the session (GET /api/v1/me, POST /auth/logout) and
// GraphQL by persisted operation (the operation's hash only; python/svc/portal/webapp.py).
import type { TypedDocumentString } from "./gql/graphql";

export interface Session {
  user: string;
  csrf: string;
  expires_at: string;
}

/** A GraphQL error as the portal sends it: a refusal carries the decision's qid. */
export class ApiError extends Error {
  code: string;
  decisionQid?: string;
  constructor(message: string, code: string, decisionQid?: string) {
    super(message);
    this.code = code;
    this.decisionQid = decisionQid;
  }
}

let session: Session | null = null;

/** Sends the browser to the provider's sign-in, coming back to where it was. */
export function signIn(): never {
  const next = window.location.pathname + window.location.search;
  window.location.assign(`/auth/login?next=${encodeURIComponent(next)}`);
  throw new ApiError("signing in", "UNAUTHENTICATED");
}

/** The signed-in person, or a redirect to sign in. */
export async function loadSession(): Promise<Session> {
  const r = await fetch("/api/v1/me", { credentials: "same-origin" });
  if (r.status === 401) signIn();
  if (!r.ok) throw new ApiError(`the portal answered ${r.status}`, "UNAVAILABLE");
  session = (await r.json()) as Session;
  return session;
}

export async function signOut(): Promise<void> {
  if (session) {
    await fetch("/auth/logout", {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRF-Token": session.csrf },
    });
  }
  session = null;
  window.location.assign("/signed-out");
}

interface GqlResponse<T> {
  data?: T;
  errors?: { message: string; extensions?: Record<string, unknown> }[];
}

/** Runs one of the app's persisted operations and answers its data (ApiError otherwise). */
export async function gql<R, V>(
  doc: TypedDocumentString<R, V>,
  ...[variables]: V extends Record<string, never> ? [] | [V] : [V]
): Promise<R> {
  const s = session ?? (await loadSession());
  const hash = (doc as unknown as { __meta__?: { hash: string } }).__meta__?.hash;
  const r = await fetch("/graphql", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": s.csrf },
    body: JSON.stringify({
      variables: variables ?? {},
      extensions: { persistedQuery: { version: 1, sha256Hash: hash } },
    }),
  });
  if (r.status === 401) signIn();
  const body = (await r.json().catch(() => ({}))) as GqlResponse<R> & { detail?: string };
  if (!r.ok) throw new ApiError(body.detail ?? `the portal answered ${r.status}`, `HTTP_${r.status}`);
  if (body.errors?.length) {
    const e = body.errors[0];
    const ext = e.extensions ?? {};
    throw new ApiError(e.message, String(ext.code ?? "ERROR"), ext.decision_qid as string | undefined);
  }
  return body.data as R;
}
